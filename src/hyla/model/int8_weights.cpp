#include "hyla/model/int8_weights.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "hyla/core/error.h"
#include "hyla/kernels/int8_gemm.h"

namespace hyla {

std::string int8_scale_name(const std::string& weight) { return weight + ".scale"; }

std::map<std::string, std::string> int8_metadata(int64_t block) {
  return {{"quantization", "int8"}, {"block", std::to_string(block)}};
}

int64_t int8_block_from_metadata(const std::map<std::string, std::string>& metadata, const std::string& source) {
  const auto kind = metadata.find("quantization"), block_text = metadata.find("block");
  HYLA_CHECK(kind != metadata.end() && kind->second == "int8" && block_text != metadata.end(),
             "{}: holds I8 tensors but its __metadata__ lacks \"quantization\": \"int8\" and a \"block\"", source);
  const std::string& text = block_text->second;
  int64_t block = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), block);
  HYLA_CHECK(error == std::errc() && end == text.data() + text.size() && int8_block_supported(block),
             "{}: __metadata__ block '{}' is not one of 16, 32, 64, 128, 256", source, text);
  return block;
}

void check_int8_scales(const float* scales, int64_t n, const std::string& source, const std::string& weight) {
  for (int64_t i = 0; i < n; ++i)
    HYLA_CHECK(std::isfinite(scales[i]) && scales[i] >= 0.0f,
               "{}: tensor '{}' holds {} at index {}; int8 scales are finite and >= 0", source, int8_scale_name(weight),
               scales[i], i);
}

}  // namespace hyla
