#pragma once
// Array helpers for the hand-written kernels, built on vec.h's 16-lane vector (AVX-512 or the
// portable fallback): exp over an array, σ on a vector, and dot products. (GCC does not reliably
// vectorise float reductions, even under `omp simd`, so the reductions are written out.)
#include <cstdint>

#include "hyla/kernels/cpu/vec.h"

namespace hyla {

// x[i] = exp(x[i]) for n floats (vec::exp: ~1e-7 relative error, 0 below -104).
inline void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store(x + i, vec::exp(vec::load(x + i)));
  if (i < n) {
    const vec::Mask m = vec::lane_range(0, n - i);
    vec::store(x + i, vec::exp(vec::load(x + i, m)), m);
  }
}

// σ(x) = 1 / (1 + e^{-x}) on a vector (the scalar activations.h sigmoid calls libm's expf once
// per value: a decoded token's KDA gates spent 15 µs in it).
inline vec::Vec sigmoid(vec::Vec x) {
  return vec::broadcast(1.0f) / (vec::broadcast(1.0f) + vec::exp(vec::zero() - x));
}

// σ and silu in place over n values, on the calling thread (defined in activations.cpp).
void sigmoid_inplace(float* x, int64_t n);
void silu_inplace(float* x, int64_t n);

// Σ a[i]·b[i].
inline float dot(const float* a, const float* b, int64_t n) {
  vec::Vec acc = vec::zero();
  int64_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) acc = vec::fmadd(vec::load(a + i), vec::load(b + i), acc);
  if (i < n) {
    const vec::Mask m = vec::lane_range(0, n - i);
    acc = vec::fmadd(vec::load(a + i, m), vec::load(b + i, m), acc);
  }
  return vec::sum(acc);
}

// Σ a[i]·b[i]·c[i].
inline float dot3(const float* a, const float* b, const float* c, int64_t n) {
  vec::Vec acc = vec::zero();
  int64_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes)
    acc = vec::fmadd(vec::load(a + i) * vec::load(b + i), vec::load(c + i), acc);
  if (i < n) {
    const vec::Mask m = vec::lane_range(0, n - i);
    acc = vec::fmadd(vec::load(a + i, m) * vec::load(b + i, m), vec::load(c + i, m), acc);
  }
  return vec::sum(acc);
}

}  // namespace hyla
