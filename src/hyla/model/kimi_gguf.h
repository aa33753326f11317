#pragma once
// hyla's SPEC model and llama.cpp's `kimi-k3` and `kimi-linear` GGUF files, both ways: the
// metadata keys, the tensor names, and the transforms llama.cpp's converter applies
// (docs/kimi-llamacpp.md §3–4):
//   A_log                  ↔ ssm_a = −exp(A_log)
//   kv_b_proj              ↔ attn_k_b (per head, transposed) and attn_v_b
//   experts.{i}.*_proj     ↔ ffn_{gate,up,down}_exps, stacked along the slowest dimension
//   *_res_query, *_res_norm ↔ *_res_score = query ⊙ norm weight (read back as the score with a
//                            norm of ones: the same function)
//   lat_norm               ↔ ffn_routed_norm (optional in llama.cpp: absent, no norm, moe.latent_norm false)
// What a GGUF cannot express (a config llama.cpp's graphs do not run) is an error naming the
// option; so is a GGUF that SPEC cannot express.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hyla/io/gguf.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"

namespace hyla {

// Whether `path` is a file that starts with the GGUF magic.
bool is_gguf_file(const std::filesystem::path& path);

// "kimi-k3" or "kimi-linear": the llama.cpp graph that runs `config` (an error when none does).
std::string kimi_gguf_arch(const ModelConfig& config);

ModelConfig config_from_gguf(const GgufFile& gguf);

// What weights_from_gguf makes of a file's quantised matrix-product weights. MXFP4 experts stay
// MXFP4 in every mode; a matrix is kept in a stored form only where every part of its product
// (Param::stored_like_next) is.
enum class GgufQuantized : uint8_t {
  Decoded,    // every other one decoded exactly to f32 (the f32 evaluation of the file)
  Converted,  // Q8_0 as hyla's int8 with block 32 (the same codes and scales), the rest f32: what a
              // model directory can hold (hyla convert)
  InPlace,    // as Converted, and every other quantised type as its blocks (U8 [rows, row bytes],
              // MappedBytes::ggml_blocks), multiplied where they lie in the map (kernels/ggml_gemm.h)
};

// Every parameter of `config`'s model, read on demand from `gguf`: a view of the mapped file where
// the tensor is stored as F32, F16 or BF16 in hyla's layout; quantised matrix-product weights as
// `quantized` says; else an f32 copy (every quantised type decoded exactly, A_log and kv_b_proj
// rebuilt).
ModelWeights weights_from_gguf(std::shared_ptr<const GgufFile> gguf, const ModelConfig& config,
                               GgufQuantized quantized = GgufQuantized::Converted);

struct GgufExportOptions {
  GgmlType matrices = GgmlType::F32;  // matrix-product weights; norms, biases, convs and the router stay F32
  std::string name = "hyla";          // general.name
  GgufMetadata tokenizer;             // tokenizer.ggml.* (data/gguf_vocab.h); none: token ids only
  uint64_t split_max_bytes = 0;       // > 0: a split set of shards of at most this many tensor bytes (GgufWriter)
};

struct GgufExport {
  std::string arch;                          // the architecture written
  std::vector<std::filesystem::path> files;  // the file, or the shards in order
};

// Writes `config` and `weights` (a hyla model's tensors, any float dtype) as a llama.cpp GGUF (or a
// split set of them), atomically and one tensor at a time.
GgufExport save_kimi_gguf(const std::filesystem::path& path, const ModelConfig& config, const ModelWeights& weights,
                           const GgufExportOptions& options);

}  // namespace hyla
