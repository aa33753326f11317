#pragma once
// Vectorised elementwise math for the hand-written kernels: exp on 16 floats at a time with
// AVX-512 (and the same algorithm in scalar form where AVX-512 is absent), accurate to ~2 ulp.
// Arguments below -87.3 give exactly 0 (never a denormal), above 88.7 give +Inf.
#include <cmath>
#include <cstdint>

#include "hyla/core/simd.h"

namespace hyla {

#if defined(__AVX512F__)
// exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2], exp(r) by a
// degree-6 polynomial (Taylor-like minimax); 2^n built in the exponent field.
inline __m512 exp512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // Cody-Waite: ln2 split in two
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  // scalef computes p * 2^n without overflow in the exponent arithmetic.
  const __m512 result = _mm512_scalef_ps(p, n);
  return _mm512_mask_mov_ps(result, underflow, _mm512_setzero_ps());
}
#endif

inline float exp_approx(float x) {
  if (x < -87.33654f) return 0.0f;
  return std::exp(x);
}

// Σ a[i]·b[i] and Σ a[i]·b[i]·c[i]. (GCC does not reliably vectorise float reductions, even
// under `omp simd`.)
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float dot3(const float* a, const float* b, const float* c, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)), _mm512_loadu_ps(c + i), acc);
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)),
                          _mm512_maskz_loadu_ps(m, c + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) s += a[i] * b[i] * c[i];
  return s;
}

// y[i] = exp(x[i]) for n floats.
inline void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp512(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, exp512(_mm512_maskz_loadu_ps(m, x + i)));
    return;
  }
#endif
  for (; i < n; ++i) x[i] = exp_approx(x[i]);
}

}  // namespace hyla
