#include "hyla/model/mxfp4_weights.h"

#include "hyla/core/error.h"
#include "hyla/core/team.h"
#include "hyla/kernels/mxfp4_gemm.h"

namespace hyla {

std::string mxfp4_scale_name(const std::string& weight) { return weight + ".scale"; }

void check_mxfp4_scales(const uint8_t* scales, int64_t n, const std::string& source, const std::string& weight) {
  const int64_t bad = mxfp4_first_nan_scale(scales, n);
  HYLA_CHECK(bad < 0, "{}: tensor '{}' holds 0xFF (NaN in E8M0) at index {}; MXFP4 scales are 0..254", source,
             mxfp4_scale_name(weight), bad);
}

void quantize_mxfp4_weights(const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales) {
  HYLA_ASSERT(cols % kMxfp4Block == 0);
  const int64_t blocks = cols / kMxfp4Block;
  parallel_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t b = 0; b < blocks; ++b)
        scales[r * blocks + b] =
            mxfp4_quantize_block(w + r * cols + b * kMxfp4Block, codes + r * cols / 2 + b * kMxfp4Block / 2);
  });
}

}  // namespace hyla
