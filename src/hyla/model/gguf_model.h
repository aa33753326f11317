#pragma once
// hyla's SPEC model and llama.cpp's GGUF files, both ways, for every architecture that has one
// (model/arch/architecture.h): its metadata keys and tensor table come from its architecture file;
// this file runs them, with the transforms llama.cpp's converters apply (GgufLink), the quantised
// types kept or decoded, and split sets. What a GGUF cannot express (a config llama.cpp's graphs do
// not run) is an error naming the option; so is a GGUF that SPEC cannot express.
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

struct Architecture;

// `config`'s architecture, checked to have a llama.cpp GGUF format and its rules kept (an error
// naming `source` otherwise).
const Architecture& gguf_architecture(const ModelConfig& config, const std::string& source);

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

// Writes `config` and `weights` (a hyla model's tensors, any float dtype) as a llama.cpp GGUF of
// `config.architecture` (or a split set of them), atomically and one tensor at a time.
GgufExport save_gguf(const std::filesystem::path& path, const ModelConfig& config, const ModelWeights& weights,
                     const GgufExportOptions& options);

}  // namespace hyla
