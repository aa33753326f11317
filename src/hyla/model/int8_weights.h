#pragma once
// hyla's int8 weight format (SPEC §8, docs/quantization.md). A matrix-product weight `name`
// [out, in] is stored as I8 values plus `name.scale`, F32 [out, in / block]: symmetric per block
// of `block` consecutive input features of each row, scale = max|w| / 127 and
// q = round-to-nearest-even(w / scale) (an all-zero block has scale 0). A file holding I8 tensors
// says so in its __metadata__: {"quantization": "int8", "block": "32"}.
#include <cstdint>
#include <map>
#include <string>

namespace hyla {

constexpr int64_t kDefaultInt8Block = 32;

std::string int8_scale_name(const std::string& weight);  // weight + ".scale"
std::map<std::string, std::string> int8_metadata(int64_t block);
// The block a file's __metadata__ declares; fails, naming `source`, unless it declares int8
// quantisation with a supported block (int8_block_supported).
int64_t int8_block_from_metadata(const std::map<std::string, std::string>& metadata, const std::string& source);

// Fails unless every scale is finite and >= 0, naming `source` and the scales tensor of `weight`.
void check_int8_scales(const float* scales, int64_t n, const std::string& source, const std::string& weight);

}  // namespace hyla
