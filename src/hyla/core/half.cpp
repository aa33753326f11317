#include "hyla/core/half.h"

#include "hyla/core/simd.h"

namespace hyla {

float to_f32(f16 x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t exponent = (x.bits >> 10) & 0x1fu;
  const uint32_t mantissa = x.bits & 0x3ffu;
  if (exponent == 0x1f)  // Inf, or NaN made quiet as the hardware conversion does
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
  if (exponent == 0) {
    const float magnitude = float(mantissa) * 0x1p-24f;  // exact: subnormal or zero
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

f16 to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};  // >= 65520 rounds to Inf
  if (a < 0x38800000u) {                                    // below 2^-14: subnormal result
    const uint32_t exponent = a >> 23;
    if (exponent < 102) return {sign};  // below 2^-25: rounds to zero
    const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1))) ++q;
    return {uint16_t(sign | q)};
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);  // rebias exponent by -112, round to nearest even
  return {uint16_t(sign | (a >> 13))};
}

void convert(const float* src, bf16* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  // Integer rounding (not vcvtneps2bf16, which flushes subnormal inputs to zero).
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
    r = _mm512_mask_or_epi32(r, nan, u, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = to_bf16(src[i]);
}

void convert(const bf16* src, float* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
#endif
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

void convert(const float* src, f16* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = to_f16(src[i]);
}

void convert(const f16* src, float* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = to_f32(src[i]);
}

}  // namespace hyla
