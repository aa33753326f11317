#include "hyla/kernels/activations.h"

#include <cmath>

#include "hyla/kernels/vmath.h"

namespace hyla {
namespace {

// Vectorised σ(x) = 1 / (1 + e^{-x}) for one vector.
inline vec::Vec sigmoid(vec::Vec x) { return vec::broadcast(1.0f) / (vec::broadcast(1.0f) + vec::exp(vec::zero() - x)); }

template <typename F>
void map_inplace(float* x, int64_t n, F f) {
  int64_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store(x + i, f(vec::load(x + i)));
  if (i < n) {
    const vec::Mask m = vec::lane_range(0, n - i);
    vec::store(x + i, f(vec::load(x + i, m)), m);
  }
}

}  // namespace

void sigmoid_inplace(float* x, int64_t n) {
  map_inplace(x, n, [](vec::Vec v) { return sigmoid(v); });
}

void silu_inplace(float* x, int64_t n) {
  map_inplace(x, n, [](vec::Vec v) { return v * sigmoid(v); });
}

void gated_activation_forward(GatedActivation act, const float* gu, int64_t rows, int64_t width, float* h) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = gu + r * 2 * width;
    const float* b = a + width;
    float* out = h + r * width;
    for (int64_t j = 0; j < width; ++j) {
      if (act == GatedActivation::Swiglu) {
        out[j] = silu(a[j]) * b[j];
      } else {
        out[j] = 4.0f * std::tanh(a[j] * 0.25f) * hyla::sigmoid(a[j]) * (25.0f * std::tanh(b[j] * 0.04f));
      }
    }
  }
}

void gated_activation_backward(GatedActivation act, const float* gu, const float* dh, int64_t rows, int64_t width,
                               float* dgu) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = gu + r * 2 * width;
    const float* b = a + width;
    const float* g = dh + r * width;
    float* da = dgu + r * 2 * width;
    float* db = da + width;
    for (int64_t j = 0; j < width; ++j) {
      const float s = hyla::sigmoid(a[j]);
      if (act == GatedActivation::Swiglu) {
        da[j] = g[j] * b[j] * s * (1.0f + a[j] * (1.0f - s));
        db[j] = g[j] * a[j] * s;
      } else {
        const float ta = std::tanh(a[j] * 0.25f), tb = std::tanh(b[j] * 0.04f);
        const float f = 4.0f * ta * s, f_prime = (1.0f - ta * ta) * s + 4.0f * ta * s * (1.0f - s);
        const float gb = 25.0f * tb, gb_prime = 1.0f - tb * tb;
        da[j] = g[j] * f_prime * gb;
        db[j] = g[j] * f * gb_prime;
      }
    }
  }
}

}  // namespace hyla
