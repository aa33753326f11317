#pragma once
// bf16 and IEEE f16 storage types with round-to-nearest-even conversion from f32.
// The scalar functions are the definition; the array functions are vectorised (AVX-512 where
// compiled for it) and produce bit-identical results, NaN payloads and subnormals included.
#include <bit>
#include <cstddef>
#include <cstdint>

namespace hyla {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float to_f32(bf16 x) { return std::bit_cast<float>(uint32_t(x.bits) << 16); }

inline bf16 to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x0040u)};  // quiet the NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}

float to_f32(f16 x);
f16 to_f16(float f);

void convert(const float* src, bf16* dst, size_t n);
void convert(const bf16* src, float* dst, size_t n);
void convert(const float* src, f16* dst, size_t n);
void convert(const f16* src, float* dst, size_t n);

}  // namespace hyla
