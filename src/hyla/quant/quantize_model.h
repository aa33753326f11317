#pragma once
// `hyla quantize`: writes a copy of a model directory whose matrix-product weights are int8 with
// per-block scales, or whose routed experts are MXFP4 (docs/quantization.md). Every other tensor,
// and every other file of the directory (config.json, tokenizer.json, ...), is copied unchanged.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hyla/model/int8_weights.h"

namespace hyla {

enum class ExpertFormat : uint8_t { Int8, Mxfp4 };
ExpertFormat parse_expert_format(const std::string& text);  // "int8" | "mxfp4"

struct QuantizeOptions {
  int64_t block = kDefaultInt8Block;
  bool keep_lm_head = false;  // leave lm_head.weight floating point
  ExpertFormat experts = ExpertFormat::Int8;  // the routed experts' format
  bool only_experts = false;  // leave every other weight as it is (Kimi's releases: MXFP4 experts, the rest bf16)
};

struct QuantizeSummary {
  int64_t int8_tensors = 0, int8_params = 0;    // weights written as int8 (and their element count)
  int64_t mxfp4_tensors = 0, mxfp4_params = 0;  // routed experts' weights written as MXFP4
  int64_t float_tensors = 0, float_params = 0;  // tensors copied as they were
  uint64_t bytes_in = 0, bytes_out = 0;          // tensor data
  std::vector<std::string> kept;                 // int8-capable weights left floating point, and why
};

// Reads `in` (F32, BF16 or F16 weights) and atomically writes `out` (which must differ from it).
QuantizeSummary quantize_model(const std::filesystem::path& in, const std::filesystem::path& out,
                               const QuantizeOptions& options);

}  // namespace hyla
