#include "hyla/kernels/resample.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/error.h"
#include "hyla/core/team.h"

namespace hyla {
namespace {

constexpr int kMaxTaps = 4;

// The source taps and weights of one output index along one axis.
struct Taps {
  int count = 0;
  int64_t index[kMaxTaps];
  float weight[kMaxTaps];
};

Taps taps(GridResample mode, int64_t out_index, int64_t in, int64_t out) {
  const float scale = float(in) / float(out);  // PyTorch forms the scale and source index in f32
  float s = scale * (float(out_index) + 0.5f) - 0.5f;
  Taps t;
  auto clamp = [in](int64_t i) { return std::clamp<int64_t>(i, 0, in - 1); };
  if (mode == GridResample::Bilinear) {
    s = std::max(s, 0.0f);
    const int64_t i0 = int64_t(s);
    const float frac = s - float(i0);
    t.count = 2;
    t.index[0] = clamp(i0), t.weight[0] = 1.0f - frac;
    t.index[1] = clamp(i0 + 1), t.weight[1] = frac;
    return t;
  }
  const float base = std::floor(s), x = s - base;
  constexpr float a = -0.75f;
  // Keys' cubic convolution: |d| ≤ 1 and 1 < |d| < 2 pieces, at distances 1 + x, x, 1 − x, 2 − x.
  auto near = [](float d) { return ((a + 2.0f) * d - (a + 3.0f)) * d * d + 1.0f; };
  auto far = [](float d) { return ((a * d - 5.0f * a) * d + 8.0f * a) * d - 4.0f * a; };
  t.count = 4;
  const float w[4] = {far(x + 1.0f), near(x), near(1.0f - x), far(2.0f - x)};
  for (int k = 0; k < 4; ++k) t.index[k] = clamp(int64_t(base) - 1 + k), t.weight[k] = w[k];
  return t;
}

void check(int64_t src_h, int64_t src_w, int64_t channels, int64_t dst_h, int64_t dst_w) {
  HYLA_CHECK(src_h > 0 && src_w > 0 && channels > 0 && dst_h > 0 && dst_w > 0,
             "resample_grid: need positive sizes, got {}x{} -> {}x{} of {} channels", src_h, src_w, dst_h, dst_w,
             channels);
}

}  // namespace

void resample_grid(GridResample mode, const float* src, int64_t src_h, int64_t src_w, int64_t channels, float* dst,
                   int64_t dst_h, int64_t dst_w) {
  check(src_h, src_w, channels, dst_h, dst_w);
  parallel_rows(dst_h, dst_w * channels * 16, [&](int64_t begin, int64_t end) {
    for (int64_t y = begin; y < end; ++y) {
      const Taps ty = taps(mode, y, src_h, dst_h);
      for (int64_t x = 0; x < dst_w; ++x) {
        const Taps tx = taps(mode, x, src_w, dst_w);
        float* out = dst + (y * dst_w + x) * channels;
        std::fill(out, out + channels, 0.0f);
        for (int i = 0; i < ty.count; ++i)
          for (int j = 0; j < tx.count; ++j) {
            const float w = ty.weight[i] * tx.weight[j];
            const float* in = src + (ty.index[i] * src_w + tx.index[j]) * channels;
#pragma omp simd
            for (int64_t c = 0; c < channels; ++c) out[c] += w * in[c];
          }
      }
    }
  });
}

void resample_grid_backward(GridResample mode, const float* d_dst, int64_t dst_h, int64_t dst_w, int64_t channels,
                            float* d_src, int64_t src_h, int64_t src_w) {
  check(src_h, src_w, channels, dst_h, dst_w);
  for (int64_t y = 0; y < dst_h; ++y) {
    const Taps ty = taps(mode, y, src_h, dst_h);
    for (int64_t x = 0; x < dst_w; ++x) {
      const Taps tx = taps(mode, x, src_w, dst_w);
      const float* g = d_dst + (y * dst_w + x) * channels;
      for (int i = 0; i < ty.count; ++i)
        for (int j = 0; j < tx.count; ++j) {
          const float w = ty.weight[i] * tx.weight[j];
          float* out = d_src + (ty.index[i] * src_w + tx.index[j]) * channels;
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c) out[c] += w * g[c];
        }
    }
  }
}

}  // namespace hyla
