#include "hyla/io/ggml_types.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/core/half.h"
#include "hyla/core/unaligned.h"
#include "hyla/io/ggml_iq_grids.h"

// Compiled with -ffp-contract=off (CMakeLists.txt): ggml's reference rounds every product and sum
// as its C source writes them, and a fused multiply-add would change the last bit.

namespace hyla {
namespace {

// ggml.h's enum ggml_type, for naming the types hyla does not read.
constexpr std::array<std::string_view, 43> kTypeNames = {
    "F32",     "F16",    "Q4_0",    "Q4_1",   "type 4", "type 5", "Q5_0",  "Q5_1",  "Q8_0",  "Q8_1",  "Q2_K",
    "Q3_K",    "Q4_K",   "Q5_K",    "Q6_K",   "Q8_K",   "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
    "IQ3_S",   "IQ2_S",  "IQ4_XS",  "I8",     "I16",    "I32",    "I64",   "F64",   "IQ1_M", "BF16",  "type 31",
    "type 32", "type 33", "TQ1_0",  "TQ2_0",  "type 36", "type 37", "type 38", "MXFP4", "NVFP4", "Q1_0",  "Q2_0"};

constexpr std::array kReadable = {
    GgmlType::F32,    GgmlType::F16,    GgmlType::Q4_0,    GgmlType::Q4_1,   GgmlType::Q5_0,   GgmlType::Q5_1,
    GgmlType::Q8_0,   GgmlType::Q2_K,   GgmlType::Q3_K,    GgmlType::Q4_K,   GgmlType::Q5_K,   GgmlType::Q6_K,
    GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ3_XXS, GgmlType::IQ1_S,  GgmlType::IQ4_NL, GgmlType::IQ3_S,
    GgmlType::IQ2_S,  GgmlType::IQ4_XS, GgmlType::IQ1_M,   GgmlType::BF16,   GgmlType::TQ1_0,  GgmlType::TQ2_0,
    GgmlType::MXFP4};

constexpr int kSuper = 256;  // QK_K: the values of a K, IQ (but IQ4_NL) or TQ block

// E2M1 values doubled (ggml's kvalues_mxfp4); the block scale is then 2^(e − 128).
constexpr std::array<int8_t, 16> kMxfp4Values = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// IQ4_NL and IQ4_XS: a non-linear 4-bit code book.
constexpr std::array<int8_t, 16> kIq4Values = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

float half_at(const uint8_t* p) { return to_f32(load_unaligned<f16>(p)); }
// Byte j of a packed grid point.
uint8_t grid_byte(uint64_t point, int j) { return uint8_t(point >> (8 * j)); }
// The IQ2/IQ3 signs: 7 stored bits of 8, the eighth making the count of minus signs even.
uint8_t even_signs(uint32_t seven) { return uint8_t(seven | (std::popcount(seven) & 1 ? 0x80u : 0u)); }

// One block of each type unpacked (ggml-quants.c's dequantize_row_*, one block, as integers and
// scales): value i = s[i / 16] · q[i] − m[i / 16], every scale computed as ggml computes the
// factor it multiplies by, so that ggml_to_f32 is bit for bit ggml's. m is written only by the
// types with offsets (TypeInfo::has_min).

// A scale per 32 values: both of its groups of 16.
void scale32(float* s, int g, float v) { s[2 * g] = s[2 * g + 1] = v; }

void unpack_q4_0(const uint8_t* b, int8_t* q, float* s, float*) {
  s[0] = s[1] = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t((qs[j] & 15) - 8);
    q[j + 16] = int8_t((qs[j] >> 4) - 8);
  }
}

// Q4_1 and Q5_1 add their offset: m = −offset.
void unpack_q4_1(const uint8_t* b, int8_t* q, float* s, float* m) {
  s[0] = s[1] = half_at(b);
  m[0] = m[1] = -half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t(qs[j] & 15);
    q[j + 16] = int8_t(qs[j] >> 4);
  }
}

// Q5_0 and Q5_1: the fifth bit of value j is bit j of qh.
int fifth_bit(uint32_t qh, int j) { return int(qh >> j & 1) << 4; }

void unpack_q5_0(const uint8_t* b, int8_t* q, float* s, float*) {
  s[0] = s[1] = half_at(b);
  const uint32_t qh = load_unaligned<uint32_t>(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t(((qs[j] & 15) | fifth_bit(qh, j)) - 16);
    q[j + 16] = int8_t(((qs[j] >> 4) | fifth_bit(qh, j + 16)) - 16);
  }
}

void unpack_q5_1(const uint8_t* b, int8_t* q, float* s, float* m) {
  s[0] = s[1] = half_at(b);
  m[0] = m[1] = -half_at(b + 2);
  const uint32_t qh = load_unaligned<uint32_t>(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    q[j] = int8_t((qs[j] & 15) | fifth_bit(qh, j));
    q[j + 16] = int8_t((qs[j] >> 4) | fifth_bit(qh, j + 16));
  }
}

void unpack_q8_0(const uint8_t* b, int8_t* q, float* s, float*) {
  s[0] = s[1] = half_at(b);
  std::memcpy(q, b + 2, 32);
}

void unpack_mxfp4(const uint8_t* b, int8_t* q, float* s, float*) {
  s[0] = s[1] = std::ldexp(1.0f, int(b[0]) - 128);
  for (int j = 0; j < 16; ++j) {
    q[j] = kMxfp4Values[b[1 + j] & 15];
    q[j + 16] = kMxfp4Values[b[1 + j] >> 4];
  }
}

// Q2_K: 16 groups of 16, each with a 4-bit scale and a 4-bit min; 2-bit codes, four a byte, a
// byte's bit pair p holding the value 32·p further on within each half of the block.
void unpack_q2_k(const uint8_t* b, int8_t* q, float* s, float* m) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  for (int g = 0; g < 16; ++g) s[g] = d * float(scales[g] & 15), m[g] = dmin * float(scales[g] >> 4);
  for (int half = 0; half < 2; ++half, qs += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int l = 0; l < 32; ++l) *q++ = int8_t((qs[l] >> shift) & 3);
}

// Q3_K: 16 groups of 16 with 6-bit signed scales (low 4 bits in bytes 0-7, high 2 bits in bytes
// 8-11); 2-bit codes as Q2_K's, with a high bit in hmask whose absence subtracts 4.
void unpack_q3_k(const uint8_t* b, int8_t* q, float* s, float*) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = half_at(b + 108);
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? sc[i] & 15 : sc[i - 8] >> 4;
    const int high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    s[i] = d * float((low | high << 4) - 32);
  }
  uint8_t bit = 1;
  for (int half = 0; half < 2; ++half, qs += 32)
    for (int shift = 0; shift < 8; shift += 2, bit = uint8_t(bit << 1))
      for (int l = 0; l < 32; ++l) *q++ = int8_t(((qs[l] >> shift) & 3) - (hmask[l] & bit ? 0 : 4));
}

// Q4_K and Q5_K: 8 groups of 32 with a 6-bit scale and a 6-bit min each, packed in 12 bytes.
void scale_min_k4(int j, const uint8_t* s, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = s[j] & 63, min = s[j + 4] & 63;
  } else {
    scale = uint8_t((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
    min = uint8_t((s[j + 4] >> 4) | (s[j] >> 6) << 4);
  }
}

// Q4_K's and Q5_K's 4-bit codes, Q5_K's fifth bit in qh (bit 2·pair + nibble of byte l); Q4_K: none.
void k_quant_4_5(float d, float dmin, const uint8_t* sc, const uint8_t* qh, const uint8_t* qs, int8_t* q, float* s,
                 float* m) {
  for (int g = 0; g < 8; ++g) {
    uint8_t scale, min;
    scale_min_k4(g, sc, scale, min);
    scale32(s, g, d * float(scale));
    scale32(m, g, dmin * float(min));
  }
  for (int pair = 0; pair < 4; ++pair, qs += 32)
    for (int nibble = 0; nibble < 2; ++nibble) {
      const int high = 2 * pair + nibble;
      for (int l = 0; l < 32; ++l) {
        const int fifth = qh ? (qh[l] >> high & 1) << 4 : 0;
        *q++ = int8_t(((qs[l] >> (4 * nibble)) & 15) + fifth);
      }
    }
}

void unpack_q4_k(const uint8_t* b, int8_t* q, float* s, float* m) {
  k_quant_4_5(half_at(b), half_at(b + 2), b + 4, nullptr, b + 16, q, s, m);
}
void unpack_q5_k(const uint8_t* b, int8_t* q, float* s, float* m) {
  k_quant_4_5(half_at(b), half_at(b + 2), b + 4, b + 16, b + 48, q, s, m);
}

// Q6_K: 16 groups of 16 with int8 scales; 6-bit codes as 4 low bits in ql and 2 high in qh.
void unpack_q6_k(const uint8_t* b, int8_t* q, float* s, float*) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int g = 0; g < 16; ++g) s[g] = d * float(sc[g]);
  for (int half = 0; half < 2; ++half, q += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      q[l] = int8_t(((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32);
      q[l + 32] = int8_t(((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
      q[l + 64] = int8_t(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
      q[l + 96] = int8_t(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
    }
}

// Byte j is 0xff where bit j of the index is set.
constexpr std::array<uint64_t, 256> kSignMasks = [] {
  std::array<uint64_t, 256> masks{};
  for (int s = 0; s < 256; ++s)
    for (int j = 0; j < 8; ++j) masks[size_t(s)] |= uint64_t(s >> j & 1) * (uint64_t(0xff) << (8 * j));
  return masks;
}();

// 8 grid values (bytes of `point`) with the signs of `signs`' bits, bit j for value j: a byte
// whose sign is set becomes its negation (~v + 1; no grid value is 0, so no carry crosses bytes).
void signed_point(uint64_t point, uint8_t signs, int8_t* q) {
  const uint64_t mask = kSignMasks[signs];
  const uint64_t v = (point ^ mask) + (mask & 0x0101010101010101ull);
  std::memcpy(q, &v, 8);
}

// IQ2_XXS: per 32 values two words: four 8-bit grid indices, then four 7-bit sign sets and a
// 4-bit scale.
void unpack_iq2_xxs(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half_at(b);
  for (int g = 0; g < 8; ++g) {
    const uint8_t* idx = b + 2 + 8 * g;
    const uint32_t aux = load_unaligned<uint32_t>(idx + 4);
    scale32(s, g, d * (0.5f + float(aux >> 28)) * 0.25f);
    for (int l = 0; l < 4; ++l, q += 8) signed_point(ggml_grids::iq2xxs[idx[l]], even_signs((aux >> (7 * l)) & 127), q);
  }
}

// IQ2_XS: 16-bit codes (9-bit grid index, 7 sign bits); a 4-bit scale per 16 values.
void unpack_iq2_xs(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half_at(b);
  const uint8_t* scales = b + 66;
  for (int g = 0; g < 8; ++g) {
    s[2 * g] = d * (0.5f + float(scales[g] & 15)) * 0.25f;
    s[2 * g + 1] = d * (0.5f + float(scales[g] >> 4)) * 0.25f;
  }
  for (int i = 0; i < 32; ++i, q += 8) {
    const uint16_t code = load_unaligned<uint16_t>(b + 2 + 2 * i);
    signed_point(ggml_grids::iq2xs[code & 511], even_signs(code >> 9), q);
  }
}

// IQ2_S: a 10-bit grid index (8 bits in qs, 2 in qh) and 8 explicit sign bits per 8 values.
void unpack_iq2_s(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* signs = b + 2 + 32;
  const uint8_t* qh = b + 66;
  const uint8_t* scales = b + 74;
  for (int g = 0; g < 8; ++g, qs += 4, signs += 4) {
    s[2 * g] = d * (0.5f + float(scales[g] & 15)) * 0.25f;
    s[2 * g + 1] = d * (0.5f + float(scales[g] >> 4)) * 0.25f;
    for (int l = 0; l < 4; ++l, q += 8)
      signed_point(ggml_grids::iq2s[qs[l] | ((qh[g] << (8 - 2 * l)) & 0x300)], signs[l], q);
  }
}

// Two 4-value points as one 8-value one.
uint64_t point_pair(uint32_t low, uint32_t high) { return uint64_t(low) | uint64_t(high) << 32; }

// IQ3_XXS: 8-bit indices of 4-value points, then per 32 values a word of four 7-bit sign sets
// and a 4-bit scale.
void unpack_iq3_xxs(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* scales_and_signs = b + 2 + 64;
  for (int g = 0; g < 8; ++g, qs += 8) {
    const uint32_t aux = load_unaligned<uint32_t>(scales_and_signs + 4 * g);
    scale32(s, g, d * (0.5f + float(aux >> 28)) * 0.5f);
    for (int l = 0; l < 4; ++l, q += 8)
      signed_point(point_pair(ggml_grids::iq3xxs[qs[2 * l]], ggml_grids::iq3xxs[qs[2 * l + 1]]),
                   even_signs((aux >> (7 * l)) & 127), q);
  }
}

// IQ3_S: 9-bit indices of 4-value points (the ninth bit in qh), explicit signs, odd 4-bit scales
// per 32 values.
void unpack_iq3_s(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* qh = b + 66;
  const uint8_t* signs = b + 74;
  const uint8_t* scales = b + 106;
  for (int g = 0; g < 8; ++g, qs += 8, signs += 4) {
    const uint8_t sc = scales[g / 2];
    scale32(s, g, d * float(1 + 2 * (g % 2 == 0 ? sc & 15 : sc >> 4)));
    for (int l = 0; l < 4; ++l, q += 8)
      signed_point(point_pair(ggml_grids::iq3s[qs[2 * l] | ((qh[g] << (8 - 2 * l)) & 256)],
                              ggml_grids::iq3s[qs[2 * l + 1] | ((qh[g] << (7 - 2 * l)) & 256)]),
                   signs[l], q);
  }
}

// IQ1_S and IQ1_M: 8 grid values in {-1, 0, 1} shifted by ±1/8, as 8·v ± 1 under a scale of 1/8
// the block's (the same real products, so the same roundings).
void iq1_point(uint64_t point, bool minus, int8_t* q) {
  for (int j = 0; j < 8; ++j) q[j] = int8_t(8 * int8_t(grid_byte(point, j)) + (minus ? -1 : 1));
}

// IQ1_S: 11-bit indices of 8-value points (3 high bits per index in qh), a 3-bit odd scale and the
// sign of the shift per 32 values.
void unpack_iq1_s(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int g = 0; g < 8; ++g, qs += 4) {
    const uint16_t qh = load_unaligned<uint16_t>(b + 34 + 2 * g);
    scale32(s, g, d * float(2 * ((qh >> 12) & 7) + 1) * 0.125f);
    for (int l = 0; l < 4; ++l, q += 8) iq1_point(ggml_grids::iq1s[qs[l] | (((qh >> (3 * l)) & 7) << 8)], qh & 0x8000, q);
  }
}

// IQ1_M: IQ1_S's points with a shift sign per 8 values and a 3-bit scale per 16; the block's f16
// scale is spread over the top nibbles of the four scale words.
void unpack_iq1_m(const uint8_t* b, int8_t* q, float* s, float*) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + 32;
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = load_unaligned<uint16_t>(b + 48 + 2 * i);
  const uint16_t scale_bits =
      uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
  const float d = to_f32(f16{scale_bits});
  for (int g = 0; g < 8; ++g, qs += 4, qh += 2) {
    s[2 * g] = d * float(2 * ((sc[g / 2] >> (6 * (g % 2))) & 7) + 1) * 0.125f;
    s[2 * g + 1] = d * float(2 * ((sc[g / 2] >> (6 * (g % 2) + 3)) & 7) + 1) * 0.125f;
    for (int l = 0; l < 4; ++l, q += 8) {
      const uint8_t h = qh[l / 2];
      const int high = l % 2 == 0 ? (h << 8) & 0x700 : (h << 4) & 0x700;
      iq1_point(ggml_grids::iq1s[qs[l] | high], h & (l % 2 == 0 ? 0x08 : 0x80), q);
    }
  }
}

void unpack_iq4_nl(const uint8_t* b, int8_t* q, float* s, float*) {
  s[0] = s[1] = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4Values[qs[j] & 15];
    q[j + 16] = kIq4Values[qs[j] >> 4];
  }
}

// IQ4_XS: IQ4_NL's code book with a 6-bit scale per 32 values (4 bits in scales_l, 2 in scales_h).
void unpack_iq4_xs(const uint8_t* b, int8_t* q, float* s, float*) {
  const float d = half_at(b);
  const uint16_t scales_h = load_unaligned<uint16_t>(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int g = 0; g < 8; ++g, q += 32, qs += 16) {
    const int ls = ((scales_l[g / 2] >> (4 * (g % 2))) & 15) | ((scales_h >> (2 * g)) & 3) << 4;
    scale32(s, g, d * float(ls - 32));
    for (int j = 0; j < 16; ++j) {
      q[j] = kIq4Values[qs[j] & 15];
      q[j + 16] = kIq4Values[qs[j] >> 4];
    }
  }
}

// TQ1_0: ternary values five a byte (base 3, most significant first, as a fixed-point fraction
// of 256), the last 16 values four a byte in qh.
int8_t ternary(uint8_t byte, int digit) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = uint8_t(byte * kPow3[digit]);
  return int8_t(((uint16_t(q) * 3) >> 8) - 1);
}

void unpack_tq1_0(const uint8_t* b, int8_t* q, float* s, float*) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + 48;
  std::fill_n(s, 16, half_at(b + 52));
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) *q++ = ternary(qs[m], n);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) *q++ = ternary(qs[32 + m], n);
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) *q++ = ternary(qh[j], n);
}

// TQ2_0: 2-bit codes 0-2 for -1, 0, 1, four a byte as Q2_K lays them.
void unpack_tq2_0(const uint8_t* b, int8_t* q, float* s, float*) {
  std::fill_n(s, 16, half_at(b + 64));
  for (int half = 0; half < 2; ++half)
    for (int shift = 0; shift < 8; shift += 2)
      for (int m = 0; m < 32; ++m) *q++ = int8_t(((b[32 * half + m] >> shift) & 3) - 1);
}

struct TypeInfo {
  int64_t values, bytes;
  void (*unpack)(const uint8_t*, int8_t*, float*, float*);  // null for F32, F16, BF16
  bool has_min = false;
};

TypeInfo info(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return {1, 4, nullptr};
    case GgmlType::F16: case GgmlType::BF16: return {1, 2, nullptr};
    case GgmlType::Q4_0: return {32, 18, unpack_q4_0};
    case GgmlType::Q4_1: return {32, 20, unpack_q4_1, true};
    case GgmlType::Q5_0: return {32, 22, unpack_q5_0};
    case GgmlType::Q5_1: return {32, 24, unpack_q5_1, true};
    case GgmlType::Q8_0: return {32, 34, unpack_q8_0};
    case GgmlType::MXFP4: return {32, 17, unpack_mxfp4};
    case GgmlType::IQ4_NL: return {32, 18, unpack_iq4_nl};
    case GgmlType::Q2_K: return {kSuper, 84, unpack_q2_k, true};
    case GgmlType::Q3_K: return {kSuper, 110, unpack_q3_k};
    case GgmlType::Q4_K: return {kSuper, 144, unpack_q4_k, true};
    case GgmlType::Q5_K: return {kSuper, 176, unpack_q5_k, true};
    case GgmlType::Q6_K: return {kSuper, 210, unpack_q6_k};
    case GgmlType::IQ2_XXS: return {kSuper, 66, unpack_iq2_xxs};
    case GgmlType::IQ2_XS: return {kSuper, 74, unpack_iq2_xs};
    case GgmlType::IQ2_S: return {kSuper, 82, unpack_iq2_s};
    case GgmlType::IQ3_XXS: return {kSuper, 98, unpack_iq3_xxs};
    case GgmlType::IQ3_S: return {kSuper, 110, unpack_iq3_s};
    case GgmlType::IQ1_S: return {kSuper, 50, unpack_iq1_s};
    case GgmlType::IQ1_M: return {kSuper, 56, unpack_iq1_m};
    case GgmlType::IQ4_XS: return {kSuper, 136, unpack_iq4_xs};
    case GgmlType::TQ1_0: return {kSuper, 54, unpack_tq1_0};
    case GgmlType::TQ2_0: return {kSuper, 66, unpack_tq2_0};
  }
  fail("ggml type {} is not one hyla reads", uint32_t(type));
}

}  // namespace

std::string ggml_type_name(uint32_t type) {
  return type < kTypeNames.size() ? std::string(kTypeNames[type]) : fmt::format("type {}", type);
}

std::span<const GgmlType> ggml_readable_types() { return kReadable; }

bool ggml_type_readable(uint32_t type) {
  return std::ranges::find(kReadable, GgmlType(type)) != kReadable.end();
}

bool ggml_type_writable(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::MXFP4: return true;
    default: return false;
  }
}

GgmlType ggml_type_from_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  for (GgmlType t : kReadable)
    if (ggml_type_writable(uint32_t(t)) && ggml_type_name(uint32_t(t)) == upper) return t;
  fail("GGUF type '{}': hyla writes f32, f16, bf16, q8_0 and mxfp4", name);
}

int64_t ggml_block_values(GgmlType type) { return info(type).values; }
int64_t ggml_block_bytes(GgmlType type) { return info(type).bytes; }

uint64_t ggml_bytes(GgmlType type, int64_t n) {
  const TypeInfo t = info(type);
  HYLA_ASSERT(n % t.values == 0);
  return uint64_t(n / t.values) * uint64_t(t.bytes);
}

void ggml_to_f32(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    // GGUF data is aligned to 32 bytes and every slice hyla takes starts on a whole element.
    case GgmlType::F16: return convert(reinterpret_cast<const f16*>(src), dst, size_t(n));
    case GgmlType::BF16: return convert(reinterpret_cast<const bf16*>(src), dst, size_t(n));
    default: break;
  }
  const TypeInfo t = info(type);
  HYLA_ASSERT(n % t.values == 0);
  alignas(64) int8_t q[kSuper];
  float scale[kSuper / kGgmlGroup], min[kSuper / kGgmlGroup];
  for (int64_t b = 0; b < n / t.values; ++b, dst += t.values) {
    t.unpack(src + b * t.bytes, q, scale, min);
    if (t.has_min)
      for (int64_t i = 0; i < t.values; ++i) dst[i] = scale[i / kGgmlGroup] * float(q[i]) - min[i / kGgmlGroup];
    else
      for (int64_t i = 0; i < t.values; ++i) dst[i] = scale[i / kGgmlGroup] * float(q[i]);
  }
}

int64_t ggml_first_nonfinite_block(GgmlType type, const uint8_t* blocks, int64_t count) {
  // Where each type keeps its f16 scales: every value of a block is finite when they are.
  const auto f16_fields = [](GgmlType t) -> std::vector<int> {
    switch (t) {
      case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
      case GgmlType::Q2_K: return {80, 82};
      case GgmlType::Q3_K: return {108};
      case GgmlType::Q6_K: return {208};
      case GgmlType::TQ1_0: return {52};
      case GgmlType::TQ2_0: return {64};
      case GgmlType::IQ1_M: case GgmlType::MXFP4: return {};
      default: return {0};
    }
  };
  const std::vector<int> fields = f16_fields(type);
  const int64_t bytes = ggml_block_bytes(type);
  const auto finite_half = [](uint16_t h) { return (h & 0x7c00) != 0x7c00; };
  for (int64_t b = 0; b < count; ++b) {
    const uint8_t* block = blocks + b * bytes;
    bool finite = true;
    if (type == GgmlType::MXFP4) {
      finite = block[0] != 0xff;
    } else if (type == GgmlType::IQ1_M) {
      uint16_t bits = 0;
      for (int i = 0; i < 4; ++i) bits = uint16_t(bits | (load_unaligned<uint16_t>(block + 48 + 2 * i) >> 12) << (4 * i));
      finite = finite_half(bits);
    }
    for (int at : fields) finite = finite && finite_half(load_unaligned<uint16_t>(block + at));
    if (!finite) return b;
  }
  return -1;
}

bool ggml_type_quantized(GgmlType type) { return info(type).unpack != nullptr; }
bool ggml_type_has_min(GgmlType type) { return info(type).has_min; }

void ggml_unpack(GgmlType type, const uint8_t* src, int64_t n, int8_t* q, float* scale, float* min) {
  const TypeInfo t = info(type);
  HYLA_ASSERT(t.unpack && n % t.values == 0);
  const int64_t groups = t.values / kGgmlGroup;
  for (int64_t b = 0; b < n / t.values; ++b)
    t.unpack(src + b * t.bytes, q + b * t.values, scale + b * groups, t.has_min ? min + b * groups : nullptr);
}

void f32_to_ggml(GgmlType type, const float* src, uint8_t* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16: return convert(src, reinterpret_cast<f16*>(dst), size_t(n));
    case GgmlType::BF16: return convert(src, reinterpret_cast<bf16*>(dst), size_t(n));
    case GgmlType::Q8_0: return quantize_q8_0(src, dst, n);
    default: break;
  }
  fail("{} is not written from f32 (MXFP4 comes from packed MXFP4 data; hyla writes f32, f16, bf16, q8_0)",
       ggml_type_name(uint32_t(type)));
}

void quantize_q8_0(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, dst += 34) {
    const float* x = src + b * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const f16 scale = to_f16(d);
    std::memcpy(dst, &scale, 2);
    for (int j = 0; j < 32; ++j) dst[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
  }
}

void mxfp4_blocks_to_codes(const uint8_t* blocks, int64_t n, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < n / 32; ++b, blocks += 17, codes += 16) {
    scales[b] = blocks[0];
    const uint8_t* qs = blocks + 1;
    for (int j = 0; j < 8; ++j) {
      codes[j] = uint8_t((qs[2 * j] & 15) | (qs[2 * j + 1] & 15) << 4);
      codes[8 + j] = uint8_t((qs[2 * j] >> 4) | (qs[2 * j + 1] >> 4) << 4);
    }
  }
}

void mxfp4_codes_to_blocks(const uint8_t* codes, const uint8_t* scales, int64_t n, uint8_t* blocks) {
  for (int64_t b = 0; b < n / 32; ++b, blocks += 17, codes += 16) {
    blocks[0] = scales[b];
    uint8_t* qs = blocks + 1;
    for (int j = 0; j < 8; ++j) {
      qs[2 * j] = uint8_t((codes[j] & 15) | (codes[8 + j] & 15) << 4);
      qs[2 * j + 1] = uint8_t((codes[j] >> 4) | (codes[8 + j] >> 4) << 4);
    }
  }
}

}  // namespace hyla
