#include "hyla/model/int8_weights.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "hyla/core/error.h"
#include "hyla/core/team.h"
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

void quantize_int8_weights(const float* w, int64_t rows, int64_t cols, int64_t block, int8_t* values, float* scales) {
  HYLA_ASSERT(cols % block == 0);
  const int64_t blocks = cols / block;
  parallel_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const float* x = w + r * cols + b * block;
        int8_t* q = values + r * cols + b * block;
        float max_abs = 0.0f;
        for (int64_t k = 0; k < block; ++k) max_abs = std::max(max_abs, std::fabs(x[k]));
        const float scale = max_abs / 127.0f;
        scales[r * blocks + b] = scale;
        for (int64_t k = 0; k < block; ++k)
          q[k] = scale > 0.0f ? int8_t(std::clamp(std::nearbyint(x[k] / scale), -127.0f, 127.0f)) : int8_t(0);
      }
  });
}

}  // namespace hyla
