#pragma once
// A 16-lane f32 vector for the hand-written kernels: one zmm register when compiled for AVX-512,
// two ymm registers for AVX2 with FMA, otherwise 16 floats in plain loops (the portable fallback, e.g. HYLA_NATIVE=OFF builds for
// x86-64-v2; the compiler vectorises the loops for whatever the target has). A kernel written once
// against Vec compiles to the same instructions as hand-written intrinsics on AVX-512.
// Only the operations the kernels need are here.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "hyla/core/half.h"
#include "hyla/core/simd.h"

namespace hyla::vec {

constexpr int kLanes = 16;
using Mask = uint16_t;  // bit i selects lane i

// The lanes [lo, hi), clipped to [0, 16).
inline Mask lane_range(int64_t lo, int64_t hi) {
  lo = std::clamp<int64_t>(lo, 0, kLanes);
  hi = std::clamp<int64_t>(hi, 0, kLanes);
  if (hi <= lo) return 0;
  return Mask(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}
constexpr Mask kAll = 0xffff;

// exp(x) = 2^n · e^r with n = round(x · log2 e) and r = x − n·ln2 ∈ [−ln2/2, ln2/2]. ln2 is split
// in two (Cody–Waite): kLn2Hi has 16 significant bits, so n·kLn2Hi is exact for |n| < 256. e^r is
// its Taylor polynomial to degree 7 (truncation error ≤ 0.347^8/8! ≈ 5e-9, far below float
// rounding). x is clamped to [−104, 89] first so that n stays finite: below −104 the result
// underflows to 0 and above 89 it overflows to inf, as e^x does; NaN stays NaN.
constexpr float kExpLo = -104.0f, kExpHi = 89.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606820309417232e-6f;
constexpr float kExpPoly[8] = {1.0f,         1.0f,          1.0f / 2,    1.0f / 6,
                               1.0f / 24,    1.0f / 120,    1.0f / 720,  1.0f / 5040};

// Calls f(std::integral_constant<int, I>{}) for I = 0..N-1, unrolled at compile time. Kernels
// index their register arrays (Vec acc[N]) only through these constants: with plain loops GCC 12
// keeps such arrays on the stack and stores every accumulator on every iteration.
template <int N, typename F>
inline void unroll(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

#if defined(__AVX512F__)

// The register type itself (not a struct around it): GCC keeps arrays of it in registers, and its
// vector extensions already give +, - and *.
using Vec = __m512;
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec broadcast(float x) { return _mm512_set1_ps(x); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }  // others 0
inline void store(float* p, Vec a) { _mm512_storeu_ps(p, a); }
inline void store(float* p, Vec a, Mask m) { _mm512_mask_storeu_ps(p, m, a); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }  // a·b + c
// Lane-wise a > b ? a : b and a < b ? a : b (so a NaN in b passes through, a NaN in a doesn't).
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec select(Mask m, Vec a, Vec b) { return _mm512_mask_blend_ps(m, a, b); }  // m ? b : a
inline Mask equal(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
inline float sum(Vec a) { return _mm512_reduce_add_ps(a); }

// 16 bf16 pairs (32-bit words, the pair's first element in the low half) as two f32 vectors.
inline void load_bf16_pairs(const uint32_t* p, Mask m, Vec& lo, Vec& hi) {
  const __m512i w = _mm512_maskz_loadu_epi32(m, p);
  lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u))));
}

inline Vec exp(Vec x) {
  x = min(broadcast(kExpHi), max(broadcast(kExpLo), x));
  const Vec n = _mm512_roundscale_ps(x * broadcast(kLog2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm512_fnmadd_ps(n, broadcast(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, broadcast(kLn2Lo), r);
  Vec p = broadcast(kExpPoly[7]);
  for (int i = 6; i >= 0; --i) p = fmadd(p, r, broadcast(kExpPoly[i]));
  return _mm512_scalef_ps(p, n);  // p · 2^n, rounding once (to 0 below the subnormals)
}

// 16 bf16 values widened to f32 (exact: bf16 is the top half of an f32); masked-off lanes are 0.
inline Vec load_bf16(const bf16* p, Mask m = kAll) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Sixteen horizontal sums from 8 vectors of half sums: w[2b + c] holds 8 partial sums of output
// b + 8c in its low 256 bits and 8 of output b + 4 + 8c in its high 256 bits (b < 4, c < 2). Lane
// o of the result is output o's total. Three levels of one shuffle pair and one add each, halving
// the partial sums per output (21 instructions).
inline Vec sum_halves(const Vec* w) {
  Vec x[4], z[2];
  unroll<4>([&](auto i) {  // 128-bit chunk k of x[i]: four partial sums of output i + 4k
    const Vec c = w[2 * i], d = w[2 * i + 1];
    x[i] = _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(2, 0, 2, 0)) + _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 1, 3, 1));
  });
  unroll<2>([&](auto i) {  // chunk k of z[i]: two partial sums of outputs 2i + 4k and 2i + 1 + 4k
    const Vec e = x[2 * i], f = x[2 * i + 1];
    z[i] = _mm512_shuffle_ps(e, f, _MM_SHUFFLE(1, 0, 1, 0)) + _mm512_shuffle_ps(e, f, _MM_SHUFFLE(3, 2, 3, 2));
  });
  // chunk k: outputs 4k .. 4k + 3
  return _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)) + _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1));
}

// Lane i of the result is the sum of the 16 lanes of v[i] (45 instructions for 16 sums, against
// 16 separate horizontal reductions of ~8 each): one level of adds of 256-bit halves puts the
// inputs in sum_halves' layout.
inline Vec sum_each(const Vec* v) {
  Vec w[8];
  unroll<4>([&](auto b) {
    unroll<2>([&](auto c) {  // [lo(b + 8c) + hi(b + 8c) | lo(b + 4 + 8c) + hi(b + 4 + 8c)]
      const Vec a = v[b + 8 * c], d = v[b + 4 + 8 * c];
      w[2 * b + c] =
          _mm512_shuffle_f32x4(a, d, _MM_SHUFFLE(1, 0, 1, 0)) + _mm512_shuffle_f32x4(a, d, _MM_SHUFFLE(3, 2, 3, 2));
    });
  });
  return sum_halves(w);
}

#elif defined(__AVX2__) && defined(__FMA__)

// Two ymm registers (AVX2 machines without AVX-512: AMD Zen 2/3, Intel before Skylake-SP). The
// lanes' order is lo's 8 then hi's 8; masked loads and stores touch no masked-off lane's memory,
// as AVX-512's do.
struct Vec {
  __m256 lo, hi;
};
namespace detail {
// The 8 lanes whose bits are set, as all-ones 32-bit lanes.
inline __m256i lanes(unsigned bits) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(bits & 0xffu)), bit), bit);
}
// [sum(v0), ..., sum(v7)]: three levels of horizontal adds, then the two 128-bit halves.
inline __m256 sums_of_8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6, __m256 v7) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
// 2^n for integer-valued n in [-150, 128], in two factors so that each is a normal float.
inline __m256 scale_by_power_of_2(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const auto power = [](__m256i k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
  };
  return _mm256_mul_ps(_mm256_mul_ps(p, power(n1)), power(n2));
}
}  // namespace detail

inline Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec broadcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline Vec load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Vec load(const float* p, Mask m) {  // others 0
  return {_mm256_maskload_ps(p, detail::lanes(m)), _mm256_maskload_ps(p + 8, detail::lanes(m >> 8))};
}
inline void store(float* p, Vec a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline void store(float* p, Vec a, Mask m) {
  _mm256_maskstore_ps(p, detail::lanes(m), a.lo);
  _mm256_maskstore_ps(p + 8, detail::lanes(m >> 8), a.hi);
}
inline Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Vec operator/(Vec a, Vec b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline Vec fmadd(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
// As AVX-512's: a > b ? a : b and a < b ? a : b (a NaN in b passes through, a NaN in a doesn't).
inline Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline Vec min(Vec a, Vec b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline Vec select(Mask m, Vec a, Vec b) {  // m ? b : a
  return {_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(detail::lanes(m))),
          _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(detail::lanes(m >> 8)))};
}
inline Mask equal(Vec a, Vec b) {
  return Mask(unsigned(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_EQ_OQ))) |
              unsigned(_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_EQ_OQ))) << 8);
}
inline float sum(Vec a) {
  const __m256 s = _mm256_add_ps(a.lo, a.hi);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// 16 bf16 pairs (32-bit words, the pair's first element in the low half) as two f32 vectors.
inline void load_bf16_pairs(const uint32_t* p, Mask m, Vec& lo, Vec& hi) {
  const int* q = reinterpret_cast<const int*>(p);
  const __m256i w0 = _mm256_maskload_epi32(q, detail::lanes(m)), w1 = _mm256_maskload_epi32(q + 8, detail::lanes(m >> 8));
  const __m256i top = _mm256_set1_epi32(int(0xffff0000u));
  lo = {_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16))};
  hi = {_mm256_castsi256_ps(_mm256_and_si256(w0, top)), _mm256_castsi256_ps(_mm256_and_si256(w1, top))};
}

inline Vec exp(Vec x) {
  x = min(broadcast(kExpHi), max(broadcast(kExpLo), x));
  const auto half = [](__m256 v) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), v);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpPoly[7]);
    for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
    return detail::scale_by_power_of_2(p, n);  // NaN stays NaN through p
  };
  return {half(x.lo), half(x.hi)};
}

// 16 bf16 values widened to f32 (exact: bf16 is the top half of an f32); masked-off lanes are 0
// (a partial mask goes through a copy, so no lane past it is read).
inline Vec load_bf16(const bf16* p, Mask m = kAll) {
  alignas(32) uint16_t part[kLanes];
  const void* from = p;
  if (m != kAll) {
    for (int i = 0; i < kLanes; ++i) part[i] = (m >> i) & 1 ? p[i].bits : uint16_t(0);
    from = part;
  }
  const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(from));
  const auto widen = [](__m128i x) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16)); };
  return {widen(_mm256_castsi256_si128(h)), widen(_mm256_extracti128_si256(h, 1))};
}

// Sixteen horizontal sums from 8 vectors of half sums: w[2b + c] holds 8 partial sums of output
// b + 8c in its lo and 8 of output b + 4 + 8c in its hi (b < 4, c < 2). Lane o of the result is
// output o's total.
inline Vec sum_halves(const Vec* w) {
  return {detail::sums_of_8(w[0].lo, w[2].lo, w[4].lo, w[6].lo, w[0].hi, w[2].hi, w[4].hi, w[6].hi),
          detail::sums_of_8(w[1].lo, w[3].lo, w[5].lo, w[7].lo, w[1].hi, w[3].hi, w[5].hi, w[7].hi)};
}

// Lane i of the result is the sum of the 16 lanes of v[i].
inline Vec sum_each(const Vec* v) {
  __m256 h[kLanes];
  for (int i = 0; i < kLanes; ++i) h[i] = _mm256_add_ps(v[i].lo, v[i].hi);
  return {detail::sums_of_8(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]),
          detail::sums_of_8(h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15])};
}

#else

struct Vec {
  float v[kLanes];
};
template <typename F>
inline Vec map(F f) {
  Vec r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = f(i);
  return r;
}
inline Vec broadcast(float x) { return map([&](int) { return x; }); }
inline Vec zero() { return broadcast(0.0f); }
inline Vec load(const float* p) { return map([&](int i) { return p[i]; }); }
inline Vec load(const float* p, Mask m) { return map([&](int i) { return (m >> i) & 1 ? p[i] : 0.0f; }); }
inline void store(float* p, Vec a) {
  for (int i = 0; i < kLanes; ++i) p[i] = a.v[i];
}
inline void store(float* p, Vec a, Mask m) {
  for (int i = 0; i < kLanes; ++i)
    if ((m >> i) & 1) p[i] = a.v[i];
}
inline Vec operator+(Vec a, Vec b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
inline Vec operator-(Vec a, Vec b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
inline Vec operator*(Vec a, Vec b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
inline Vec operator/(Vec a, Vec b) { return map([&](int i) { return a.v[i] / b.v[i]; }); }
// Not fused: without hardware FMA std::fma is a slow library call.
inline Vec fmadd(Vec a, Vec b, Vec c) { return map([&](int i) { return a.v[i] * b.v[i] + c.v[i]; }); }
inline Vec max(Vec a, Vec b) { return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
inline Vec min(Vec a, Vec b) { return map([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
inline Vec select(Mask m, Vec a, Vec b) { return map([&](int i) { return (m >> i) & 1 ? b.v[i] : a.v[i]; }); }
inline Mask equal(Vec a, Vec b) {
  Mask m = 0;
  for (int i = 0; i < kLanes; ++i) m |= Mask(a.v[i] == b.v[i]) << i;
  return m;
}
inline float sum(Vec a) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += a.v[i];
  return s;
}

inline void load_bf16_pairs(const uint32_t* p, Mask m, Vec& lo, Vec& hi) {
  for (int i = 0; i < kLanes; ++i) {
    const uint32_t w = (m >> i) & 1 ? p[i] : 0u;
    lo.v[i] = std::bit_cast<float>(w << 16);
    hi.v[i] = std::bit_cast<float>(w & 0xffff0000u);
  }
}

inline Vec exp(Vec x) {
  x = min(broadcast(kExpHi), max(broadcast(kExpLo), x));
  return map([&](int i) {
    if (std::isnan(x.v[i])) return x.v[i];
    const float n = std::nearbyint(x.v[i] * kLog2e);
    const float r = (x.v[i] - n * kLn2Hi) - n * kLn2Lo;
    float p = kExpPoly[7];
    for (int k = 6; k >= 0; --k) p = p * r + kExpPoly[k];
    return std::ldexp(p, int(n));
  });
}

inline Vec load_bf16(const bf16* p, Mask m = kAll) {
  return map([&](int i) { return (m >> i) & 1 ? to_f32(p[i]) : 0.0f; });
}

inline Vec sum_halves(const Vec* w) {
  return map([&](int o) {
    const Vec& x = w[2 * (o % 4) + o / 8];
    float total = 0.0f;
    for (int i = 0; i < 8; ++i) total += x.v[8 * ((o / 4) % 2) + i];
    return total;
  });
}

inline Vec sum_each(const Vec* v) {
  return map([&](int i) { return sum(v[i]); });
}

#endif

inline Vec negative_infinity() { return broadcast(-std::numeric_limits<float>::infinity()); }

}  // namespace hyla::vec
