#include "hyla/kernels/cpu/ggml_fused.h"

#include <array>
#include <bit>
#include <cstring>

#include "hyla/core/simd.h"
#include "hyla/core/unaligned.h"
#include "hyla/io/ggml_iq_grids.h"

namespace hyla::ggml_fused {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__F16C__)
namespace {

float half_at(const uint8_t* p) { return _cvtsh_ss(load_unaligned<uint16_t>(p)); }

// 32 bytes of x from `a`, then 32 from `b`.
__m512i x_pair(const int8_t* a, const int8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}
__m512i load64(const void* p) { return _mm512_loadu_si512(p); }
// 32 bytes in both halves.
__m512i broadcast32(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// Each lane l of the result: v's lane idx[l].
__m512i lanes(std::array<int, 16> idx, __m512i v) {
  return _mm512_permutexvar_epi32(_mm512_set_epi32(idx[15], idx[14], idx[13], idx[12], idx[11], idx[10], idx[9], idx[8],
                                                   idx[7], idx[6], idx[5], idx[4], idx[3], idx[2], idx[1], idx[0]),
                                  v);
}
// Lanes 0-7 from group a's lane, 8-15 from group b's (a 64-byte vector of two 32-value groups).
constexpr std::array<int, 16> halves(int a, int b) { return {a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b}; }
// 64 consecutive values from `first` on: lane l (4 values) is in group first / 16 + l / 4.
constexpr std::array<int, 16> quarters(int first_group) {
  std::array<int, 16> idx{};
  for (int l = 0; l < 16; ++l) idx[size_t(l)] = first_group + l / 4;
  return idx;
}
__m512i dp(__m512i unsigned_bytes, __m512i signed_bytes) {
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), unsigned_bytes, signed_bytes);
}
__m512i xsum(const int32_t* p) { return _mm512_loadu_si512(p); }
// dp · scale per lane where both fit in 16 bits (a vpdpbusd sum of 4 products of at most 63 · 127,
// a scale below 2^15) and the scale's high 16 bits are 0: one vpmaddwd, not vpmulld's two uops.
__m512i times(__m512i dp_sums, __m512i scale) { return _mm512_madd_epi16(dp_sums, scale); }
// A signed scale with its high 16 bits cleared, for times().
__m512i low16(__m512i scale) { return _mm512_and_si512(scale, _mm512_set1_epi32(0xffff)); }

// Q4_K's 12 scale bytes as sc0…sc7, m0…m7 (6 bits each; ggml's layout).
__m512i q4_k_scales(const uint8_t* packed) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t m0 = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = m0;
  u[0] &= kLow6;
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
}

// Q4_K and Q5_K: value (pair p, nibble n, l) = 64p + 32n + l, its fifth bit (Q5_K) bit 2p + n of qh[l].
template <bool kFifthBit>
float dot_q45_k(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t* xsum16, int64_t blocks) {
  constexpr int64_t kBytes = kFifthBit ? 176 : 144, kQs = kFifthBit ? 48 : 16;
  const __m512i low4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);
  __m512 acc = _mm512_setzero_ps(), acc_min = _mm512_setzero_ps();
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * kBytes;
    const int8_t* x = xq + i * 256;
    const __m512i scales = q4_k_scales(b + 4);
    const __m512i qh = kFifthBit ? broadcast32(b + 16) : _mm512_setzero_si512();
    __m512i total = _mm512_setzero_si512();
    for (int half = 0; half < 2; ++half) {  // pairs 2·half and 2·half + 1
      const __m512i q = load64(b + kQs + 64 * half);
      __m512i lo = _mm512_and_si512(q, low4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
      if constexpr (kFifthBit) {
        const int bit = 4 * half;  // lo: bits bit, bit + 2 (per 32-byte half); hi: bit + 1, bit + 3
        const __m512i lo_shift = _mm512_inserti64x4(_mm512_set1_epi16(int16_t(bit)), _mm256_set1_epi16(int16_t(bit + 2)), 1);
        const __m512i hi_shift = _mm512_add_epi16(lo_shift, _mm512_set1_epi16(1));
        lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, lo_shift), one), 4));
        hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, hi_shift), one), 4));
      }
      const int8_t* xh = x + 128 * half;
      const int g = 4 * half;
      total = _mm512_add_epi32(total, times(dp(lo, x_pair(xh, xh + 64)), lanes(halves(g, g + 2), scales)));
      total = _mm512_add_epi32(total,
                               times(dp(hi, x_pair(xh + 32, xh + 96)), lanes(halves(g + 1, g + 3), scales)));
    }
    const float dx = xscale16[16 * i];
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(half_at(b) * dx), acc);
    // Σ m_g · Σ q_x over group g (32 values: two of xsum16's groups), m in lanes 8-15.
    constexpr std::array<int, 16> kMinOfGroup16 = {8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};
    const __m512i mins = _mm512_mullo_epi32(lanes(kMinOfGroup16, scales), xsum(xsum16 + 16 * i));
    acc_min = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_set1_ps(half_at(b + 2) * dx), acc_min);
  }
  return _mm512_reduce_add_ps(acc) - _mm512_reduce_add_ps(acc_min);
}

// Q6_K: per half h of the block, ql's 64 bytes hold values 128h + l (low nibbles of bytes 0-31),
// 128h + 32 + l (low, 32-63), 128h + 64 + l and 128h + 96 + l (high nibbles); qh's 32 bytes their
// top two bits (bit pairs 0, 1, 2, 3 in that order). Codes 0-63 stand for q − 32.
float dot_q6_k(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t* xsum16, int64_t blocks) {
  const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(3);
  const __m512i lo_shift = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
  const __m512i hi_shift = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * 210;
    const int8_t* x = xq + i * 256;
    const __m512i scales = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    const __m512i scales16 = low16(scales);
    // The −32 of every code: Σ_g scale_g · 32 · Σ q_x over g.
    __m512i total = _mm512_slli_epi32(_mm512_mullo_epi32(scales, xsum(xsum16 + 16 * i)), 5);
    total = _mm512_sub_epi32(_mm512_setzero_si512(), total);
    for (int half = 0; half < 2; ++half) {
      const __m512i ql = load64(b + 64 * half), qh = broadcast32(b + 128 + 32 * half);
      const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, lo_shift), low2), 4));
      const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, hi_shift), low2), 4));
      const int8_t* xh = x + 128 * half;
      total = _mm512_add_epi32(total, times(dp(lo, load64(xh)), lanes(quarters(8 * half), scales16)));
      total = _mm512_add_epi32(total, times(dp(hi, load64(xh + 64)), lanes(quarters(8 * half + 4), scales16)));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(half_at(b + 208) * xscale16[16 * i]), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Q2_K and Q3_K: qs's 64 bytes hold, in bit pair j of byte 32h + l, value 128h + 32j + l; groups
// of 16 values. Lane l of the vector for bit pair j covers group 8·(l / 8) + 2j + (l % 8) / 4.
constexpr std::array<int, 16> q2_k_groups(int j) {
  std::array<int, 16> idx{};
  for (int l = 0; l < 16; ++l) idx[size_t(l)] = 8 * (l / 8) + 2 * j + (l % 8) / 4;
  return idx;
}

float dot_q2_k(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t* xsum16, int64_t blocks) {
  const __m512i low2 = _mm512_set1_epi8(3);
  __m512 acc = _mm512_setzero_ps(), acc_min = _mm512_setzero_ps();
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * 84;
    const int8_t* x = xq + i * 256;
    const __m512i packed = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    const __m512i scales = _mm512_and_si512(packed, _mm512_set1_epi32(15)), mins = _mm512_srli_epi32(packed, 4);
    const __m512i qs = load64(b + 16);
    __m512i total = _mm512_setzero_si512();
    [&]<int... J>(std::integer_sequence<int, J...>) {
      ((total = _mm512_add_epi32(
            total, times(dp(_mm512_and_si512(_mm512_srli_epi16(qs, 2 * J), low2), x_pair(x + 32 * J, x + 128 + 32 * J)),
                                      lanes(q2_k_groups(J), scales)))),
       ...);
    }(std::make_integer_sequence<int, 4>{});
    const float dx = xscale16[16 * i];
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(half_at(b + 80) * dx), acc);
    acc_min = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_mullo_epi32(mins, xsum(xsum16 + 16 * i))),
                              _mm512_set1_ps(half_at(b + 82) * dx), acc_min);
  }
  return _mm512_reduce_add_ps(acc) - _mm512_reduce_add_ps(acc_min);
}

// Q3_K's 12 scale bytes as its 16 signed scales (low 4 bits in bytes 0-7, high 2 in bytes 8-11).
__m512i q3_k_scales(const uint8_t* packed) {
  constexpr uint32_t kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  const uint32_t high = u[2];
  u[2] = ((u[0] >> 4) & kLow4) | (((high >> 4) & kLow2) << 4);
  u[3] = ((u[1] >> 4) & kLow4) | (((high >> 6) & kLow2) << 4);
  u[0] = (u[0] & kLow4) | ((high & kLow2) << 4);
  u[1] = (u[1] & kLow4) | (((high >> 2) & kLow2) << 4);
  return _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u))),
                          _mm512_set1_epi32(32));
}

// Q3_K: Q2_K's codes plus a high bit (bit 4h + j of hmask[l]) whose absence subtracts 4: code
// low | high << 2 stands for q + 4. Signed 6-bit scales per group of 16.
float dot_q3_k(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t* xsum16, int64_t blocks) {
  const __m512i low2 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * 110;
    const int8_t* x = xq + i * 256;
    const __m512i scales = q3_k_scales(b + 96), scales16 = low16(scales);
    __m512i total = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_mullo_epi32(scales, xsum(xsum16 + 16 * i)), 2));
    const __m512i qs = load64(b + 32), hmask = broadcast32(b);
    [&]<int... J>(std::integer_sequence<int, J...>) {
      ((total = _mm512_add_epi32(
            total,
            times(
                dp(_mm512_or_si512(
                       _mm512_and_si512(_mm512_srli_epi16(qs, 2 * J), low2),
                       _mm512_slli_epi16(
                           _mm512_and_si512(_mm512_srlv_epi16(hmask, _mm512_inserti64x4(_mm512_set1_epi16(J),
                                                                                        _mm256_set1_epi16(4 + J), 1)),
                                            one),
                           2)),
                   x_pair(x + 32 * J, x + 128 + 32 * J)),
                lanes(q2_k_groups(J), scales16)))),
       ...);
    }(std::make_integer_sequence<int, 4>{});
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(half_at(b + 108) * xscale16[16 * i]), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Byte j is 0xff where bit j of the IQ2/IQ3 sign set is set (7 stored bits, the eighth making
// the count even).
const std::array<uint64_t, 128>& even_sign_masks() {
  static const std::array<uint64_t, 128> masks = [] {
    std::array<uint64_t, 128> m{};
    for (uint32_t s = 0; s < 128; ++s) {
      const uint32_t signs = s | (std::popcount(s) & 1 ? 0x80u : 0u);
      for (int j = 0; j < 8; ++j) m[s] |= uint64_t(signs >> j & 1) * (uint64_t(0xff) << (8 * j));
    }
    return m;
  }();
  return masks;
}

// IQ2_XXS: per 32 values four grid indices, then a word of four 7-bit sign sets and a 4-bit scale
// ls: value = d / 8 · (2·ls + 1) · (± grid byte). The signs go onto x (x ^ m − m negates).
float dot_iq2_xxs(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t*, int64_t blocks) {
  const auto& signs = even_sign_masks();
  const uint64_t* grid = ggml_grids::iq2xxs;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * 66;
    const int8_t* x = xq + i * 256;
    __m512i total = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {  // groups 2k and 2k + 1
      const uint8_t* g0 = b + 2 + 16 * k;
      const uint8_t* g1 = g0 + 8;
      const uint32_t a0 = load_unaligned<uint32_t>(g0 + 4), a1 = load_unaligned<uint32_t>(g1 + 4);
      const __m512i q = _mm512_set_epi64(int64_t(grid[g1[3]]), int64_t(grid[g1[2]]), int64_t(grid[g1[1]]),
                                         int64_t(grid[g1[0]]), int64_t(grid[g0[3]]), int64_t(grid[g0[2]]),
                                         int64_t(grid[g0[1]]), int64_t(grid[g0[0]]));
      const __m512i m = _mm512_set_epi64(int64_t(signs[(a1 >> 21) & 127]), int64_t(signs[(a1 >> 14) & 127]),
                                         int64_t(signs[(a1 >> 7) & 127]), int64_t(signs[a1 & 127]),
                                         int64_t(signs[(a0 >> 21) & 127]), int64_t(signs[(a0 >> 14) & 127]),
                                         int64_t(signs[(a0 >> 7) & 127]), int64_t(signs[a0 & 127]));
      const __m512i xv = load64(x + 64 * k);
      const __m512i x_signed = _mm512_sub_epi8(_mm512_xor_si512(xv, m), m);
      const __m512i scale = _mm512_mask_blend_epi32(__mmask16(0xff00), _mm512_set1_epi32(int32_t(2 * (a0 >> 28) + 1)),
                                                    _mm512_set1_epi32(int32_t(2 * (a1 >> 28) + 1)));
      total = _mm512_add_epi32(total, times(dp(q, x_signed), scale));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(half_at(b) * xscale16[16 * i] * 0.125f), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// IQ1_S's points with 1 added to every value: bytes 0, 1, 2 for −1, 0, 1 (an unsigned operand).
const std::array<uint64_t, 2048>& iq1s_plus_one() {
  static const std::array<uint64_t, 2048> table = [] {
    std::array<uint64_t, 2048> t{};
    for (size_t i = 0; i < t.size(); ++i)
      for (int j = 0; j < 8; ++j)
        t[i] |= uint64_t(uint8_t(int8_t(ggml_grids::iq1s[i] >> (8 * j)) + 1)) << (8 * j);
    return t;
  }();
  return table;
}

// IQ1_S: per 32 values (group g) 4 indices of 8-value points in {-1, 0, 1} (3 high bits each in
// qh[g]), a 3-bit scale k and the sign of a ±1/8 shift: value = d / 8 · (2k + 1) · (8·v ± 1).
// With u = v + 1: Σ (8v ± 1)·x = 8·Σ u·x − 8·S ± S, S = Σ x over the group.
float dot_iq1_s(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t* xsum16, int64_t blocks) {
  const auto& grid = iq1s_plus_one();
  const __m512i index_shift = _mm512_set_epi64(9, 6, 3, 0, 9, 6, 3, 0);
  const __m512i seven = _mm512_set1_epi64(7);
  // Lane l of a group pair's vector: the pair's first group (l < 8) or second.
  const __m512i pair_lane[4] = {_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
                                _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4),
                                _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 6, 6, 6)};
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * 50;
    const int8_t* x = xq + i * 256;
    // Per group (lanes 0-7): qh, its odd scale 2k + 1, and Σ (±1) · x = 8 of the shift's part.
    const __m512i qh =
        _mm512_cvtepu16_epi32(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 34))));
    const __m512i scales = _mm512_add_epi32(
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(qh, 12), _mm512_set1_epi32(7)), 1), _mm512_set1_epi32(1));
    const __m512i sums16 = xsum(xsum16 + 16 * i);
    const __m512i sums = _mm512_add_epi32(_mm512_permutexvar_epi32(even, sums16), _mm512_permutexvar_epi32(odd, sums16));
    // Σ (8v ± 1)·x = 8·Σ u·x − 8·S ± S: the −8·S ± S part per group, times its scale.
    const __mmask16 minus = _mm512_test_epi32_mask(qh, _mm512_set1_epi32(0x8000));
    const __m512i factor = _mm512_mask_blend_epi32(minus, _mm512_set1_epi32(-7), _mm512_set1_epi32(-9));
    __m512i total = _mm512_maskz_mullo_epi32(0xff, _mm512_mullo_epi32(factor, sums), scales);
    for (int k = 0; k < 4; ++k) {  // groups 2k and 2k + 1
      // The 8 grid indices: qs bytes, 3 high bits each from the group's qh (bits 3l … 3l + 2).
      const __m512i low = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * k)));
      const __m512i h = _mm512_set_epi64(load_unaligned<uint16_t>(b + 36 + 4 * k), load_unaligned<uint16_t>(b + 36 + 4 * k), load_unaligned<uint16_t>(b + 36 + 4 * k),
                                         load_unaligned<uint16_t>(b + 36 + 4 * k), load_unaligned<uint16_t>(b + 34 + 4 * k), load_unaligned<uint16_t>(b + 34 + 4 * k),
                                         load_unaligned<uint16_t>(b + 34 + 4 * k), load_unaligned<uint16_t>(b + 34 + 4 * k));
      const __m512i index =
          _mm512_or_si512(low, _mm512_slli_epi64(_mm512_and_si512(_mm512_srlv_epi64(h, index_shift), seven), 8));
      const __m512i u = _mm512_i64gather_epi64(index, reinterpret_cast<const long long*>(grid.data()), 8);
      total = _mm512_add_epi32(
          total, times(_mm512_slli_epi32(dp(u, load64(x + 64 * k)), 3), _mm512_permutexvar_epi32(pair_lane[k], scales)));
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(half_at(b) * xscale16[16 * i] * 0.125f), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// The 32-value types, two blocks (64 values) a step; x is rounded per 32 values (xscale16[2b]).
// Lanes 0-7 of a step's vpdpbusd hold block 2k, 8-15 block 2k + 1.
__m512 pair_scales(float a, float b) { return _mm512_mask_blend_ps(__mmask16(0xff00), _mm512_set1_ps(a), _mm512_set1_ps(b)); }

// Σ w·x over signed codes w: |w| · (x with w's sign) (|−128| reads as 128).
__m512i signed_dp(__m512i w, __m512i x) {
  return dp(_mm512_abs_epi8(w), _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x));
}

// Q8_0: d, then 32 int8 codes.
float dot_q8_0(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t*, int64_t blocks) {
  __m512 acc = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* w = row + b * 34;
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2))),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 36)), 1);
    const __m512 scale = pair_scales(half_at(w) * xscale16[2 * b], half_at(w + 34) * xscale16[2 * b + 2]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(signed_dp(q, load64(xq + 32 * b))), scale, acc);
  }
  if (b < blocks) {  // an odd last block, in the low half. (Not a scalar loop: GCC 12 vectorises
                    // an int8 × int8 sum with vpdpbusd, which reads one operand unsigned.)
    const uint8_t* w = row + b * 34;
    const __mmask64 low = 0xffffffffull;
    const __m512i q = _mm512_maskz_loadu_epi8(low, w + 2), x = _mm512_maskz_loadu_epi8(low, xq + 32 * b);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(signed_dp(q, x)), pair_scales(half_at(w) * xscale16[2 * b], 0.0f), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Q4_0, Q4_1, Q5_0, Q5_1: 16 bytes of nibbles (value l low, value 16 + l high), Q5's fifth bits
// in a word, as unsigned codes u; Q4_0 and Q5_0 stand for u − 8 and u − 16 (their offset taken
// off with Σ x), Q4_1 and Q5_1 for d·u + m.
template <int kBytes, bool kFifthBit, bool kMin>
float dot_q45_0(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t* xsum16, int64_t blocks) {
  constexpr int kQs = 2 + (kMin ? 2 : 0) + (kFifthBit ? 4 : 0);
  constexpr int kOffset = kMin ? 0 : kFifthBit ? 16 : 8;
  const __m128i low4 = _mm_set1_epi8(0x0f);
  __m512 acc = _mm512_setzero_ps();
  float offsets = 0;
  // One block's 32 codes as 32 bytes.
  const auto codes = [&](const uint8_t* w) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + kQs));
    __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low4), _mm_and_si128(packed, low4));
    if constexpr (kFifthBit) u = _mm256_or_si256(u, _mm256_maskz_mov_epi8(load_unaligned<uint32_t>(w + 2 + (kMin ? 2 : 0)), _mm256_set1_epi8(16)));
    return u;
  };
  const auto block_offset = [&](const uint8_t* w, int64_t b) {  // the block's offset term, times s_x
    const float sum = float(xsum16[2 * b] + xsum16[2 * b + 1]) * xscale16[2 * b];
    return kMin ? half_at(w + 2) * sum : -float(kOffset) * half_at(w) * sum;
  };
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* w0 = row + b * kBytes;
    const uint8_t* w1 = w0 + kBytes;
    const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(codes(w0)), codes(w1), 1);
    const __m512 scale = pair_scales(half_at(w0) * xscale16[2 * b], half_at(w1) * xscale16[2 * b + 2]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp(u, load64(xq + 32 * b))), scale, acc);
    offsets += block_offset(w0, b) + block_offset(w1, b + 1);
  }
  if (b < blocks) {  // an odd last block, in the low half
    const uint8_t* w = row + b * kBytes;
    const __m512i x = _mm512_maskz_loadu_epi8(0xffffffffull, xq + 32 * b);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp(_mm512_zextsi256_si512(codes(w)), x)),
                          pair_scales(half_at(w) * xscale16[2 * b], 0.0f), acc);
    offsets += block_offset(w, b);
  }
  return _mm512_reduce_add_ps(acc) + offsets;
}

// IQ4_NL: d, then 16 bytes of 4-bit indices (value l low, 16 + l high) into a signed code book.
float dot_iq4_nl(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t*, int64_t blocks) {
  const __m128i book = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const auto codes = [&](const uint8_t* w) {  // one block's 32 values as signed bytes
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    return _mm256_set_m128i(_mm_shuffle_epi8(book, _mm_and_si128(_mm_srli_epi16(packed, 4), low4)),
                            _mm_shuffle_epi8(book, _mm_and_si128(packed, low4)));
  };
  __m512 acc = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* w0 = row + b * 18;
    const uint8_t* w1 = w0 + 18;
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(codes(w0)), codes(w1), 1);
    const __m512 scale = pair_scales(half_at(w0) * xscale16[2 * b], half_at(w1) * xscale16[2 * b + 2]);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(signed_dp(q, load64(xq + 32 * b))), scale, acc);
  }
  if (b < blocks) {  // an odd last block, in the low half
    const uint8_t* w = row + b * 18;
    const __m512i x = _mm512_maskz_loadu_epi8(0xffffffffull, xq + 32 * b);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(signed_dp(_mm512_zextsi256_si512(codes(w)), x)),
                          pair_scales(half_at(w) * xscale16[2 * b], 0.0f), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

DotFn dot_for(GgmlType type) {
  switch (type) {
    case GgmlType::Q2_K: return dot_q2_k;
    case GgmlType::Q3_K: return dot_q3_k;
    case GgmlType::Q4_K: return dot_q45_k<false>;
    case GgmlType::Q5_K: return dot_q45_k<true>;
    case GgmlType::Q6_K: return dot_q6_k;
    case GgmlType::IQ2_XXS: return dot_iq2_xxs;
    case GgmlType::IQ1_S: return dot_iq1_s;
    case GgmlType::Q8_0: return dot_q8_0;
    case GgmlType::IQ4_NL: return dot_iq4_nl;
    case GgmlType::Q4_0: return dot_q45_0<18, false, false>;
    case GgmlType::Q4_1: return dot_q45_0<20, false, true>;
    case GgmlType::Q5_0: return dot_q45_0<22, true, false>;
    case GgmlType::Q5_1: return dot_q45_0<24, true, true>;
    default: return nullptr;
  }
}
#else
DotFn dot_for(GgmlType) { return nullptr; }
#endif

}  // namespace hyla::ggml_fused
