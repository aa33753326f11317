#include "hyla/io/ggml_types.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>

#include "hyla/core/error.h"
#include "hyla/core/half.h"
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
constexpr float kIq1Delta = 0.125f;  // IQ1_S and IQ1_M shift every grid point by ±1/8

float half_at(const uint8_t* p) {
  f16 h;
  std::memcpy(&h, p, 2);
  return to_f32(h);
}
uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
// Byte j of a packed grid point.
uint8_t grid_byte(uint64_t point, int j) { return uint8_t(point >> (8 * j)); }
// The IQ2/IQ3 signs: 7 stored bits of 8, the eighth making the count of minus signs even.
uint8_t even_signs(uint32_t seven) { return uint8_t(seven | (std::popcount(seven) & 1 ? 0x80u : 0u)); }
float sign_of(uint8_t signs, int j) { return signs >> j & 1 ? -1.f : 1.f; }

// One block of each type to its values (ggml-quants.c's dequantize_row_*, one block).

void block_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = float((qs[j] & 15) - 8) * d;
    y[j + 16] = float((qs[j] >> 4) - 8) * d;
  }
}

void block_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(qs[j] & 15) * d + m;
    y[j + 16] = float(qs[j] >> 4) * d + m;
  }
}

// Q5_0 and Q5_1: the fifth bit of value j is bit j of qh.
int fifth_bit(uint32_t qh, int j) { return int(qh >> j & 1) << 4; }

void block_q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint32_t qh = u32_at(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    y[j] = float(((qs[j] & 15) | fifth_bit(qh, j)) - 16) * d;
    y[j + 16] = float(((qs[j] >> 4) | fifth_bit(qh, j + 16)) - 16) * d;
  }
}

void block_q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    y[j] = float((qs[j] & 15) | fifth_bit(qh, j)) * d + m;
    y[j + 16] = float((qs[j] >> 4) | fifth_bit(qh, j + 16)) * d + m;
  }
}

void block_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = float(q[j]) * d;
}

void block_mxfp4(const uint8_t* b, float* y) {
  const float d = std::ldexp(1.0f, int(b[0]) - 128);
  for (int j = 0; j < 16; ++j) {
    y[j] = float(kMxfp4Values[b[1 + j] & 15]) * d;
    y[j + 16] = float(kMxfp4Values[b[1 + j] >> 4]) * d;
  }
}

// Q2_K: 16 groups of 16, each with a 4-bit scale and a 4-bit min; 2-bit codes, four a byte, a
// byte's bit pair p holding the value 32·p further on within each half of the block.
void block_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  int group = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = scales[group++];
        const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * float((q[16 * part + l] >> shift) & 3) - ml;
      }
}

// Q3_K: 16 groups of 16 with 6-bit signed scales (low 4 bits in bytes 0-7, high 2 bits in bytes
// 8-11); 2-bit codes as Q2_K's, with a high bit in hmask whose absence subtracts 4.
void block_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* s = b + 96;
  const float d = half_at(b + 108);
  int scale[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    scale[i] = (low | high << 4) - 32;
  }
  int group = 0;
  uint8_t bit = 1;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2, bit = uint8_t(bit << 1))
      for (int part = 0; part < 2; ++part) {
        const float dl = d * float(scale[group++]);
        for (int l = 16 * part; l < 16 * part + 16; ++l)
          *y++ = dl * float(((q[l] >> shift) & 3) - (hmask[l] & bit ? 0 : 4));
      }
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
void k_quant_4_5(float d, float dmin, const uint8_t* s, const uint8_t* qh, const uint8_t* q, float* y) {
  for (int pair = 0; pair < 4; ++pair, q += 32)
    for (int nibble = 0; nibble < 2; ++nibble) {
      uint8_t sc, m;
      scale_min_k4(2 * pair + nibble, s, sc, m);
      const float dl = d * float(sc), ml = dmin * float(m);
      const int high = 2 * pair + nibble;
      for (int l = 0; l < 32; ++l) {
        const int fifth = qh ? (qh[l] >> high & 1) << 4 : 0;
        *y++ = dl * float(((q[l] >> (4 * nibble)) & 15) + fifth) - ml;
      }
    }
}

void block_q4_k(const uint8_t* b, float* y) { k_quant_4_5(half_at(b), half_at(b + 2), b + 4, nullptr, b + 16, y); }
void block_q5_k(const uint8_t* b, float* y) { k_quant_4_5(half_at(b), half_at(b + 2), b + 4, b + 16, b + 48, y); }

// Q6_K: 16 groups of 16 with int8 scales; 6-bit codes as 4 low bits in ql and 2 high in qh.
void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; ++l) {
      const int g = l / 16;
      const int q1 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
      const int q2 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
      const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      y[l] = d * float(sc[g]) * float(q1);
      y[l + 32] = d * float(sc[g + 2]) * float(q2);
      y[l + 64] = d * float(sc[g + 4]) * float(q3);
      y[l + 96] = d * float(sc[g + 6]) * float(q4);
    }
}

// IQ2_XXS: per 32 values two words: four 8-bit grid indices, then four 7-bit sign sets and a
// 4-bit scale.
void block_iq2_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int g = 0; g < 8; ++g) {
    const uint8_t* idx = b + 2 + 8 * g;
    const uint32_t aux = u32_at(idx + 4);
    const float db = d * (0.5f + float(aux >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint64_t point = ggml_grids::iq2xxs[idx[l]];
      const uint8_t signs = even_signs((aux >> (7 * l)) & 127);
      for (int j = 0; j < 8; ++j) y[j] = db * float(grid_byte(point, j)) * sign_of(signs, j);
    }
  }
}

// IQ2_XS: 16-bit codes (9-bit grid index, 7 sign bits); a 4-bit scale per 16 values.
void block_iq2_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* scales = b + 66;
  for (int g = 0; g < 8; ++g) {
    const float db[2] = {d * (0.5f + float(scales[g] & 15)) * 0.25f, d * (0.5f + float(scales[g] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint16_t code = u16_at(b + 2 + 2 * (4 * g + l));
      const uint64_t point = ggml_grids::iq2xs[code & 511];
      const uint8_t signs = even_signs(code >> 9);
      for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * float(grid_byte(point, j)) * sign_of(signs, j);
    }
  }
}

// IQ2_S: a 10-bit grid index (8 bits in qs, 2 in qh) and 8 explicit sign bits per 8 values.
void block_iq2_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* signs = b + 2 + 32;
  const uint8_t* qh = b + 66;
  const uint8_t* scales = b + 74;
  for (int g = 0; g < 8; ++g, qs += 4, signs += 4) {
    const float db[2] = {d * (0.5f + float(scales[g] & 15)) * 0.25f, d * (0.5f + float(scales[g] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint64_t point = ggml_grids::iq2s[qs[l] | ((qh[g] << (8 - 2 * l)) & 0x300)];
      for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * float(grid_byte(point, j)) * sign_of(signs[l], j);
    }
  }
}

// IQ3_XXS: 8-bit indices of 4-value points, then per 32 values a word of four 7-bit sign sets
// and a 4-bit scale.
void block_iq3_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* scales_and_signs = b + 2 + 64;
  for (int g = 0; g < 8; ++g, qs += 8) {
    const uint32_t aux = u32_at(scales_and_signs + 4 * g);
    const float db = d * (0.5f + float(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint8_t signs = even_signs((aux >> (7 * l)) & 127);
      const uint32_t p1 = ggml_grids::iq3xxs[qs[2 * l]], p2 = ggml_grids::iq3xxs[qs[2 * l + 1]];
      for (int j = 0; j < 4; ++j) {
        y[j] = db * float(grid_byte(p1, j)) * sign_of(signs, j);
        y[j + 4] = db * float(grid_byte(p2, j)) * sign_of(signs, j + 4);
      }
    }
  }
}

// IQ3_S: 9-bit indices of 4-value points (the ninth bit in qh), explicit signs, odd 4-bit scales
// per 32 values.
void block_iq3_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* qh = b + 66;
  const uint8_t* signs = b + 74;
  const uint8_t* scales = b + 106;
  for (int g = 0; g < 8; ++g, qs += 8, signs += 4) {
    const uint8_t sc = scales[g / 2];
    const float db = d * float(1 + 2 * (g % 2 == 0 ? sc & 15 : sc >> 4));
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint32_t p1 = ggml_grids::iq3s[qs[2 * l] | ((qh[g] << (8 - 2 * l)) & 256)];
      const uint32_t p2 = ggml_grids::iq3s[qs[2 * l + 1] | ((qh[g] << (7 - 2 * l)) & 256)];
      for (int j = 0; j < 4; ++j) {
        y[j] = db * float(grid_byte(p1, j)) * sign_of(signs[l], j);
        y[j + 4] = db * float(grid_byte(p2, j)) * sign_of(signs[l], j + 4);
      }
    }
  }
}

float iq1_value(uint64_t point, int j) { return float(int8_t(grid_byte(point, j))); }

// IQ1_S: 11-bit indices of 8-value points in {-1, 0, 1} (3 high bits per index in qh), a 3-bit
// odd scale and the sign of a ±1/8 shift per 32 values.
void block_iq1_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int g = 0; g < 8; ++g, qs += 4) {
    const uint16_t qh = u16_at(b + 34 + 2 * g);
    const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint64_t point = ggml_grids::iq1s[qs[l] | (((qh >> (3 * l)) & 7) << 8)];
      for (int j = 0; j < 8; ++j) y[j] = dl * (iq1_value(point, j) + delta);
    }
  }
}

// IQ1_M: IQ1_S's points with a shift sign per 8 values and a 3-bit scale per 16; the block's f16
// scale is spread over the top nibbles of the four scale words.
void block_iq1_m(const uint8_t* b, float* y) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + 32;
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = u16_at(b + 48 + 2 * i);
  const uint16_t scale_bits =
      uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
  const float d = to_f32(f16{scale_bits});
  for (int g = 0; g < 8; ++g, qs += 4, qh += 2) {
    const float dl[2] = {d * float(2 * ((sc[g / 2] >> (6 * (g % 2))) & 7) + 1),
                         d * float(2 * ((sc[g / 2] >> (6 * (g % 2) + 3)) & 7) + 1)};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint8_t h = qh[l / 2];
      const int high = l % 2 == 0 ? (h << 8) & 0x700 : (h << 4) & 0x700;
      const float delta = h & (l % 2 == 0 ? 0x08 : 0x80) ? -kIq1Delta : kIq1Delta;
      const uint64_t point = ggml_grids::iq1s[qs[l] | high];
      for (int j = 0; j < 8; ++j) y[j] = dl[l / 2] * (iq1_value(point, j) + delta);
    }
  }
}

void block_iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(kIq4Values[qs[j] & 15]);
    y[j + 16] = d * float(kIq4Values[qs[j] >> 4]);
  }
}

// IQ4_XS: IQ4_NL's code book with a 6-bit scale per 32 values (4 bits in scales_l, 2 in scales_h).
void block_iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint16_t scales_h = u16_at(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int g = 0; g < 8; ++g, y += 32, qs += 16) {
    const int ls = ((scales_l[g / 2] >> (4 * (g % 2))) & 15) | ((scales_h >> (2 * g)) & 3) << 4;
    const float dl = d * float(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * float(kIq4Values[qs[j] & 15]);
      y[j + 16] = dl * float(kIq4Values[qs[j] >> 4]);
    }
  }
}

// TQ1_0: ternary values five a byte (base 3, most significant first, as a fixed-point fraction
// of 256), the last 16 values four a byte in qh.
float ternary(uint8_t byte, int digit, float d) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t q = uint8_t(byte * kPow3[digit]);
  return float(((uint16_t(q) * 3) >> 8) - 1) * d;
}

void block_tq1_0(const uint8_t* b, float* y) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + 48;
  const float d = half_at(b + 52);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) *y++ = ternary(qs[m], n, d);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) *y++ = ternary(qs[32 + m], n, d);
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) *y++ = ternary(qh[j], n, d);
}

// TQ2_0: 2-bit codes 0-2 for -1, 0, 1, four a byte as Q2_K lays them.
void block_tq2_0(const uint8_t* b, float* y) {
  const float d = half_at(b + 64);
  for (int half = 0; half < 2; ++half)
    for (int shift = 0; shift < 8; shift += 2)
      for (int m = 0; m < 32; ++m) *y++ = float(((b[32 * half + m] >> shift) & 3) - 1) * d;
}

struct TypeInfo {
  int64_t values, bytes;
  void (*block)(const uint8_t*, float*);  // null for F32, F16, BF16
};

TypeInfo info(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return {1, 4, nullptr};
    case GgmlType::F16: case GgmlType::BF16: return {1, 2, nullptr};
    case GgmlType::Q4_0: return {32, 18, block_q4_0};
    case GgmlType::Q4_1: return {32, 20, block_q4_1};
    case GgmlType::Q5_0: return {32, 22, block_q5_0};
    case GgmlType::Q5_1: return {32, 24, block_q5_1};
    case GgmlType::Q8_0: return {32, 34, block_q8_0};
    case GgmlType::MXFP4: return {32, 17, block_mxfp4};
    case GgmlType::IQ4_NL: return {32, 18, block_iq4_nl};
    case GgmlType::Q2_K: return {kSuper, 84, block_q2_k};
    case GgmlType::Q3_K: return {kSuper, 110, block_q3_k};
    case GgmlType::Q4_K: return {kSuper, 144, block_q4_k};
    case GgmlType::Q5_K: return {kSuper, 176, block_q5_k};
    case GgmlType::Q6_K: return {kSuper, 210, block_q6_k};
    case GgmlType::IQ2_XXS: return {kSuper, 66, block_iq2_xxs};
    case GgmlType::IQ2_XS: return {kSuper, 74, block_iq2_xs};
    case GgmlType::IQ2_S: return {kSuper, 82, block_iq2_s};
    case GgmlType::IQ3_XXS: return {kSuper, 98, block_iq3_xxs};
    case GgmlType::IQ3_S: return {kSuper, 110, block_iq3_s};
    case GgmlType::IQ1_S: return {kSuper, 50, block_iq1_s};
    case GgmlType::IQ1_M: return {kSuper, 56, block_iq1_m};
    case GgmlType::IQ4_XS: return {kSuper, 136, block_iq4_xs};
    case GgmlType::TQ1_0: return {kSuper, 54, block_tq1_0};
    case GgmlType::TQ2_0: return {kSuper, 66, block_tq2_0};
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
  for (int64_t b = 0; b < n / t.values; ++b) t.block(src + b * t.bytes, dst + b * t.values);
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
