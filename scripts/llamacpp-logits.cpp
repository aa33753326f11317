// The f32 logits [T, V] that llama.cpp computes for one token sequence of a GGUF file, written as a
// safetensors file with one tensor 'logits' (the layout `hyla logits` writes), for
// scripts/check-llamacpp.sh. Built against a llama.cpp tree by that script.
//
//   llamacpp-logits MODEL.gguf 'ID,ID,...' OUT.safetensors [threads]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf 'ID,ID,...' OUT.safetensors [threads]\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> tokens;
  for (const char* p = argv[2]; *p;) {
    char* end = nullptr;
    tokens.push_back(llama_token(std::strtol(p, &end, 10)));
    if (end == p) { std::fprintf(stderr, "bad token list: %s\n", argv[2]); return 2; }
    p = *end == ',' ? end + 1 : end;
  }
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) { std::fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
  llama_context_params cp = llama_context_default_params();
  const int T = int(tokens.size());
  cp.n_ctx = uint32_t(T + 16);
  cp.n_batch = cp.n_ubatch = uint32_t(T);
  cp.n_threads = cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) { std::fprintf(stderr, "cannot create a context\n"); return 1; }
  llama_batch batch = llama_batch_init(T, 0, 1);
  for (int t = 0; t < T; ++t) {
    batch.token[t] = tokens[size_t(t)];
    batch.pos[t] = t;
    batch.n_seq_id[t] = 1;
    batch.seq_id[t][0] = 0;
    batch.logits[t] = 1;
  }
  batch.n_tokens = T;
  if (llama_decode(ctx, batch) != 0) { std::fprintf(stderr, "llama_decode failed\n"); return 1; }
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<float> logits(size_t(T) * size_t(V));
  for (int t = 0; t < T; ++t) std::memcpy(logits.data() + size_t(t) * V, llama_get_logits_ith(ctx, t), size_t(V) * 4);
  std::string header = "{\"logits\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(T) + "," + std::to_string(V) +
                       "],\"data_offsets\":[0," + std::to_string(logits.size() * 4) + "]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  const unsigned long long n = header.size();
  FILE* f = std::fopen(argv[3], "wb");
  if (!f) { std::fprintf(stderr, "cannot write %s\n", argv[3]); return 1; }
  std::fwrite(&n, 8, 1, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(logits.data(), 4, logits.size(), f);
  std::fclose(f);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
