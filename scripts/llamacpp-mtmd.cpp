// What llama.cpp's multimodal library computes for one image prompt, for
// scripts/check-llamacpp-vision.sh: the prompt (text with the media marker <__media__>) tokenised by
// mtmd with its image, the image's embeddings (the projector's output), and the f32 logits [T, V] of
// every position, image rows included. Writes a safetensors file with 'embeddings' [N, d] and
// 'logits' [T, V] (the layout `hyla logits` writes), and the token ids as a JSON list with -1 where
// the image's rows are. Also prints the time of the image's encoding and of the prompt's decoding.
// Flash attention as llama.cpp chooses it (auto), or off (its K and V then stay f32).
// Built against a llama.cpp tree (libllama, libmtmd) by that script.
//
//   llamacpp-mtmd TEXT.gguf MMPROJ.gguf IMAGE 'PROMPT' OUT.safetensors OUT.json [threads [auto|off]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool write_safetensors(const char* path, const std::vector<float>& embeddings, int n_image, int n_embd,
                       const std::vector<float>& logits, int T, int V) {
  const size_t e_bytes = embeddings.size() * 4;
  std::string header = "{\"embeddings\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n_image) + "," +
                       std::to_string(n_embd) + "],\"data_offsets\":[0," + std::to_string(e_bytes) +
                       "]},\"logits\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(T) + "," + std::to_string(V) +
                       "],\"data_offsets\":[" + std::to_string(e_bytes) + "," +
                       std::to_string(e_bytes + logits.size() * 4) + "]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  const unsigned long long n = header.size();
  FILE* f = std::fopen(path, "wb");
  if (!f) return false;
  std::fwrite(&n, 8, 1, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(embeddings.data(), 4, embeddings.size(), f);
  std::fwrite(logits.data(), 4, logits.size(), f);
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s TEXT.gguf MMPROJ.gguf IMAGE 'PROMPT' OUT.safetensors OUT.json [threads [auto|off]]\n",
                 argv[0]);
    return 2;
  }
  const int threads = argc > 7 ? std::atoi(argv[7]) : 1;
  const llama_flash_attn_type flash =
      argc > 8 && std::strcmp(argv[8], "off") == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) { std::fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
  mtmd_context_params mp = mtmd_context_params_default();
  mp.use_gpu = false, mp.n_threads = threads, mp.warmup = false, mp.flash_attn_type = flash;
  mtmd_context* mctx = mtmd_init_from_file(argv[2], model, mp);
  if (!mctx) { std::fprintf(stderr, "cannot load %s\n", argv[2]); return 1; }
  mtmd_bitmap* bitmap = mtmd_helper_bitmap_init_from_file(mctx, argv[3], false, mtmd_helper_init_opt_default()).bitmap;
  if (!bitmap) { std::fprintf(stderr, "cannot read %s\n", argv[3]); return 1; }
  mtmd_input_text text{argv[4], std::strlen(argv[4]), /*add_special=*/false, /*parse_special=*/true};
  mtmd_input_chunks* chunks = mtmd_input_chunks_init();
  const mtmd_bitmap* bitmaps[] = {bitmap};
  if (mtmd_tokenize(mctx, chunks, &text, bitmaps, 1) != 0) { std::fprintf(stderr, "mtmd_tokenize failed\n"); return 1; }

  // The rows in order: a text token's id, or -1 and the image's embedding row.
  std::vector<llama_token> ids;
  std::vector<float> embeddings;
  const int n_embd = llama_model_n_embd(model);
  int n_image = 0;
  double encode_s = 0;
  for (size_t i = 0; i < mtmd_input_chunks_size(chunks); ++i) {
    const mtmd_input_chunk* chunk = mtmd_input_chunks_get(chunks, i);
    if (mtmd_input_chunk_get_type(chunk) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
      size_t n = 0;
      const llama_token* t = mtmd_input_chunk_get_tokens_text(chunk, &n);
      ids.insert(ids.end(), t, t + n);
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    if (mtmd_encode_chunk(mctx, chunk) != 0) { std::fprintf(stderr, "mtmd_encode_chunk failed\n"); return 1; }
    encode_s += seconds_since(start);
    const int n = int(mtmd_input_chunk_get_n_tokens(chunk));
    const float* e = mtmd_get_output_embd(mctx);
    embeddings.insert(embeddings.end(), e, e + size_t(n) * n_embd);
    ids.insert(ids.end(), size_t(n), -1);
    n_image += n;
  }

  const int T = int(ids.size());
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(T + 16);
  cp.n_batch = cp.n_ubatch = uint32_t(T);
  cp.n_threads = cp.n_threads_batch = threads;
  cp.flash_attn_type = flash;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) { std::fprintf(stderr, "cannot create a context\n"); return 1; }
  // One batch of token rows and one of embedding rows per run of either, every row with logits.
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<float> logits(size_t(T) * size_t(V));
  const auto start = std::chrono::steady_clock::now();
  int image_row = 0;
  for (int begin = 0; begin < T;) {
    const bool image = ids[size_t(begin)] < 0;
    int end = begin;
    while (end < T && (ids[size_t(end)] < 0) == image) ++end;
    const int n = end - begin;
    llama_batch batch = llama_batch_init(n, image ? n_embd : 0, 1);
    for (int r = 0; r < n; ++r) {
      if (image)
        std::memcpy(batch.embd + size_t(r) * n_embd, embeddings.data() + size_t(image_row + r) * n_embd, size_t(n_embd) * 4);
      else
        batch.token[r] = ids[size_t(begin + r)];
      batch.pos[r] = begin + r;
      batch.n_seq_id[r] = 1;
      batch.seq_id[r][0] = 0;
      batch.logits[r] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) { std::fprintf(stderr, "llama_decode failed\n"); return 1; }
    for (int r = 0; r < n; ++r)
      std::memcpy(logits.data() + size_t(begin + r) * V, llama_get_logits_ith(ctx, r), size_t(V) * 4);
    llama_batch_free(batch);
    if (image) image_row += n;
    begin = end;
  }
  const double decode_s = seconds_since(start);
  std::printf("encode_s %.6f decode_s %.6f image_tokens %d tokens %d\n", encode_s, decode_s, n_image, T);

  if (!write_safetensors(argv[5], embeddings, n_image, n_embd, logits, T, V)) {
    std::fprintf(stderr, "cannot write %s\n", argv[5]);
    return 1;
  }
  FILE* f = std::fopen(argv[6], "w");
  if (!f) { std::fprintf(stderr, "cannot write %s\n", argv[6]); return 1; }
  std::fputc('[', f);
  for (int t = 0; t < T; ++t) std::fprintf(f, t ? ",%d" : "%d", ids[size_t(t)]);
  std::fputs("]\n", f);
  std::fclose(f);
  mtmd_input_chunks_free(chunks);
  mtmd_bitmap_free(bitmap);
  mtmd_free(mctx);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
