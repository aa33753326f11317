#include "hyla/kernels/activations.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/team.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {
namespace {

using vec::Vec;

// tanh(x) = 1 − 2 / (e^{2x} + 1): saturates to ±1 without overflow (e^{2x} = inf gives 1, 0 gives
// −1); absolute error ~1e-7, which is what the products downstream see (the relative error grows
// for |x| < 1e-3, where the value itself is that small).
inline Vec tanh(Vec x) {
  return vec::broadcast(1.0f) - vec::broadcast(2.0f) / (vec::exp(x + x) + vec::broadcast(1.0f));
}

template <typename F>
void map_inplace(float* x, int64_t n, F f) {
  int64_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store(x + i, f(vec::load(x + i)));
  if (i < n) {
    const vec::Mask m = vec::lane_range(0, n - i);
    vec::store(x + i, f(vec::load(x + i, m)), m);
  }
}

// Calls f(j, mask) for each vector of [0, n), the last one masked.
template <typename F>
void for_each_vector(int64_t n, F f) {
  int64_t j = 0;
  for (; j + vec::kLanes <= n; j += vec::kLanes) f(j, vec::kAll);
  if (j < n) f(j, vec::lane_range(0, n - j));
}

// SiTU's constants as vectors: β and 1/β, λ and 1/λ; `bounded` is false when λ ≤ 0 (b passes as is).
struct SituConstants {
  Vec beta, inv_beta, lambda, inv_lambda;
  bool bounded;
  explicit SituConstants(const GatedActivation& act)
      : beta(vec::broadcast(act.situ_beta)),
        inv_beta(vec::broadcast(1.0f / act.situ_beta)),
        lambda(vec::broadcast(act.situ_linear_beta)),
        inv_lambda(vec::broadcast(act.situ_linear_beta > 0.0f ? 1.0f / act.situ_linear_beta : 0.0f)),
        bounded(act.situ_linear_beta > 0.0f) {}
};

// One row: h = act(a, b).
void forward_row(GatedActivation act, const float* a, const float* b, int64_t width, float* h) {
  const SituConstants c(act);
  const bool swiglu = act.kind == GatedActivation::Kind::Swiglu;
  if (swiglu && act.swiglu_limit > 0.0f) {
    const Vec limit = vec::broadcast(act.swiglu_limit), low = vec::broadcast(-act.swiglu_limit);
    for_each_vector(width, [&](int64_t j, vec::Mask m) {
      const Vec va = vec::load(a + j, m), vb = vec::load(b + j, m);
      vec::store(h + j, vec::min(va * sigmoid(va), limit) * vec::max(vec::min(vb, limit), low), m);
    });
    return;
  }
  for_each_vector(width, [&](int64_t j, vec::Mask m) {
    const Vec va = vec::load(a + j, m), vb = vec::load(b + j, m);
    const Vec s = sigmoid(va);
    const Vec out = swiglu ? va * s * vb
                           : c.beta * tanh(va * c.inv_beta) * s * (c.bounded ? c.lambda * tanh(vb * c.inv_lambda) : vb);
    vec::store(h + j, out, m);
  });
}

// The clamped SwiGLU's backward (scalar: only some experts' rows reach it).
void clamped_swiglu_backward_row(float limit, const float* a, const float* b, const float* dh, int64_t width, float* da,
                                 float* db) {
  for (int64_t j = 0; j < width; ++j) {
    const float s = 1.0f / (1.0f + std::exp(-a[j])), silu = a[j] * s;
    const bool gate_open = silu < limit, up_open = b[j] > -limit && b[j] < limit;
    const float gate = gate_open ? silu : limit, up = up_open ? b[j] : std::clamp(b[j], -limit, limit);
    da[j] = gate_open ? dh[j] * up * s * (1.0f + a[j] * (1.0f - s)) : 0.0f;
    db[j] = up_open ? dh[j] * gate : 0.0f;
  }
}

// One row: (da, db) from dh.
void backward_row(GatedActivation act, const float* a, const float* b, const float* dh, int64_t width, float* da,
                  float* db) {
  const Vec one = vec::broadcast(1.0f);
  const SituConstants c(act);
  const bool swiglu = act.kind == GatedActivation::Kind::Swiglu;
  if (swiglu && act.swiglu_limit > 0.0f) return clamped_swiglu_backward_row(act.swiglu_limit, a, b, dh, width, da, db);
  for_each_vector(width, [&](int64_t j, vec::Mask m) {
    const Vec va = vec::load(a + j, m), vb = vec::load(b + j, m), g = vec::load(dh + j, m);
    const Vec s = sigmoid(va);
    if (swiglu) {
      // d silu(a)/da = σ(a)(1 + a(1 − σ(a)))
      vec::store(da + j, g * vb * s * vec::fmadd(va, one - s, one), m);
      vec::store(db + j, g * va * s, m);
    } else {
      // f = β·tanh(a/β)·σ(a): f' = (1 − tanh²(a/β))·σ(a) + f·(1 − σ(a))
      const Vec ta = tanh(va * c.inv_beta);
      const Vec f = c.beta * ta * s;
      const Vec f_prime = (one - ta * ta) * s + f * (one - s);
      const Vec tb = c.bounded ? tanh(vb * c.inv_lambda) : vec::zero();
      const Vec gb = c.bounded ? c.lambda * tb : vb, gb_prime = one - tb * tb;
      vec::store(da + j, g * f_prime * gb, m);
      vec::store(db + j, g * f * gb_prime, m);
    }
  });
}

}  // namespace

void sigmoid_inplace(float* x, int64_t n) {
  map_inplace(x, n, [](Vec v) { return sigmoid(v); });
}

void silu_inplace(float* x, int64_t n) {
  map_inplace(x, n, [](Vec v) { return v * sigmoid(v); });
}

void sigmoid_rows(float* x, int64_t rows, int64_t width, int64_t ld) {
  parallel_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) sigmoid_inplace(x + r * ld, width);
  });
}

void sigmoid_rows_backward(const float* s, int64_t ld_s, int64_t rows, int64_t width, float* d, int64_t ld_d) {
  parallel_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* sr = s + r * ld_s;
      float* dr = d + r * ld_d;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) dr[j] *= sr[j] * (1.0f - sr[j]);
    }
  });
}

void sigmoid_gate_forward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                          float* y) {
  parallel_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = s + r * ld_s;
      if (group == 1) {
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) y[r * width + j] = x[r * width + j] * gate[j];
        continue;
      }
      for (int64_t g = 0; g < width / group; ++g) {
        const float sg = gate[g];
        const float* xg = x + r * width + g * group;
        float* yg = y + r * width + g * group;
#pragma omp simd
        for (int64_t j = 0; j < group; ++j) yg[j] = xg[j] * sg;
      }
    }
  });
}

void sigmoid_gate_backward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                           float* dy, float* d_logit, int64_t ld_logit) {
  parallel_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = s + r * ld_s;
      const float* xr = x + r * width;
      float* dyr = dy + r * width;
      float* dz = d_logit + r * ld_logit;
      if (group == 1) {
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) {
          dz[j] = dyr[j] * xr[j] * gate[j] * (1.0f - gate[j]);
          dyr[j] *= gate[j];
        }
        continue;
      }
      for (int64_t g = 0; g < width / group; ++g) {
        const float sg = gate[g];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < group; ++j) {
          dot += dyr[g * group + j] * xr[g * group + j];
          dyr[g * group + j] *= sg;
        }
        dz[g] = dot * sg * (1.0f - sg);
      }
    }
  });
}

void gated_activation_forward(GatedActivation act, const float* gu, int64_t rows, int64_t width, float* h) {
  parallel_rows(rows, 2 * width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) forward_row(act, gu + r * 2 * width, gu + r * 2 * width + width, width, h + r * width);
  });
}

void gated_activation_backward(GatedActivation act, const float* gu, const float* dh, int64_t rows, int64_t width,
                               float* dgu) {
  parallel_rows(rows, 2 * width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* a = gu + r * 2 * width;
      float* da = dgu + r * 2 * width;
      backward_row(act, a, a + width, dh + r * width, width, da, da + width);
    }
  });
}

// Values per parallel piece of the elementwise GELU loops.
constexpr int64_t kGeluChunk = 1024;
constexpr float kSqrt2OverPi = 0.7978845608028654f, kGeluCubic = 0.044715f;

void gelu_forward(Gelu kind, const float* x, int64_t n, float* y) {
  parallel_rows((n + kGeluChunk - 1) / kGeluChunk, kGeluChunk * 8, [&](int64_t begin, int64_t end) {
    const int64_t lo = begin * kGeluChunk, hi = std::min(n, end * kGeluChunk);
    if (kind == Gelu::Tanh) {
      for_each_vector(hi - lo, [&](int64_t j, vec::Mask m) {
        const Vec v = vec::load(x + lo + j, m);
        const Vec u = vec::broadcast(kSqrt2OverPi) * (v + vec::broadcast(kGeluCubic) * v * v * v);
        vec::store(y + lo + j, vec::broadcast(0.5f) * v * (vec::broadcast(1.0f) + tanh(u)), m);
      });
      return;
    }
    // erf has no vector form here; the tower spends its time in the products, not in this loop.
    for (int64_t i = lo; i < hi; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
  });
}

void gelu_backward(Gelu kind, const float* x, const float* dy, int64_t n, float* dx) {
  parallel_rows((n + kGeluChunk - 1) / kGeluChunk, kGeluChunk * 12, [&](int64_t begin, int64_t end) {
    const int64_t lo = begin * kGeluChunk, hi = std::min(n, end * kGeluChunk);
    if (kind == Gelu::Tanh) {
      // y' = 0.5(1 + t) + 0.5·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²), t = tanh(u).
      for_each_vector(hi - lo, [&](int64_t j, vec::Mask m) {
        const Vec v = vec::load(x + lo + j, m), g = vec::load(dy + lo + j, m);
        const Vec v2 = v * v, half = vec::broadcast(0.5f), one = vec::broadcast(1.0f);
        const Vec t = tanh(vec::broadcast(kSqrt2OverPi) * (v + vec::broadcast(kGeluCubic) * v2 * v));
        const Vec du = vec::broadcast(kSqrt2OverPi) * (one + vec::broadcast(3.0f * kGeluCubic) * v2);
        vec::store(dx + lo + j, g * (half * (one + t) + half * v * (one - t * t) * du), m);
      });
      return;
    }
    // y' = Φ(x) + x·φ(x).
    for (int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      const float cdf = 0.5f * (1.0f + std::erf(v * 0.70710678118654752f));
      const float pdf = 0.3989422804014327f * std::exp(-0.5f * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  });
}

}  // namespace hyla
