#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "hyla/core/half.h"

namespace hyla {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Round-to-nearest-even by exact arithmetic in double: the reference for both conversions.
double round_to_grid(double x, double ulp) {
  const double q = x / ulp, fl = std::floor(q), rest = q - fl;
  double r = fl;
  if (rest > 0.5 || (rest == 0.5 && std::fmod(fl, 2.0) != 0.0)) r = fl + 1;
  return r * ulp;
}

TEST(Bf16, EdgeCases) {
  EXPECT_EQ(to_bf16(0.0f).bits, 0x0000);
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000);
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  // Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(to_bf16(from_bits(0x3f808000)).bits, 0x3f80);
  EXPECT_EQ(to_bf16(from_bits(0x3f818000)).bits, 0x3f82);
  EXPECT_EQ(to_bf16(from_bits(0x3f808001)).bits, 0x3f81);
  // The largest finite float rounds up to Inf.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  // Subnormals round on the same grid (no flush to zero).
  EXPECT_EQ(to_bf16(from_bits(0x00010000)).bits, 0x0001);
  EXPECT_EQ(to_bf16(from_bits(0x00008000)).bits, 0x0000);  // tie to even (zero)
  EXPECT_EQ(to_bf16(from_bits(0x00018000)).bits, 0x0002);  // tie to even (two)
  // NaN stays NaN (quiet), sign kept, even when the payload lives only in the low bits.
  const bf16 nan = to_bf16(from_bits(0x7f800001));
  EXPECT_TRUE(std::isnan(to_f32(nan)));
  EXPECT_EQ(to_bf16(from_bits(0xffc00000)).bits, 0xffc0);
  EXPECT_EQ(to_f32(bf16{0x3f80}), 1.0f);
}

TEST(Bf16, VectorMatchesScalarAndReference) {
  std::mt19937 rng(7);
  std::vector<float> x;
  for (int i = 0; i < 100000; ++i) x.push_back(from_bits(rng()));  // every class: NaN, Inf, subnormal, ...
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0x7fc00000u, 0x00000001u, 0x007fffffu, 0x3f808000u})
    x.push_back(from_bits(u));
  std::vector<bf16> v(x.size());
  convert(x.data(), v.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(v[i].bits, to_bf16(x[i]).bits) << std::hex << bits(x[i]);
    if (std::isfinite(x[i]) && std::fabs(x[i]) < 3e38f) {
      const int e = std::max(std::ilogb(x[i]), -126);
      const double expected = round_to_grid(x[i], std::ldexp(1.0, e - 7));
      ASSERT_EQ(double(to_f32(v[i])), expected) << std::hex << bits(x[i]);
    }
  }
  std::vector<float> back(x.size());
  convert(v.data(), back.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(bits(back[i]), bits(to_f32(v[i])));
}

TEST(F16, EdgeCases) {
  EXPECT_EQ(to_f16(0.0f).bits, 0x0000);
  EXPECT_EQ(to_f16(-0.0f).bits, 0x8000);
  EXPECT_EQ(to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(to_f16(65519.99f).bits, 0x7bff);
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00);  // tie rounds to even: Inf
  EXPECT_EQ(to_f16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_EQ(to_f16(0x1p-24f).bits, 0x0001);        // smallest subnormal
  EXPECT_EQ(to_f16(0x1p-25f).bits, 0x0000);        // tie with zero: even
  EXPECT_EQ(to_f16(0x1.8p-24f).bits, 0x0002);      // tie 1.5 -> 2
  EXPECT_EQ(to_f16(0x1.000002p-25f).bits, 0x0001); // just above the tie
  EXPECT_EQ(to_f16(0x1p-14f).bits, 0x0400);        // smallest normal
  EXPECT_EQ(to_f16(0x1.ff8p-15f).bits, 0x03ff);    // largest subnormal
  EXPECT_EQ(to_f16(0x1.ffcp-15f).bits, 0x0400);    // tie between it and the smallest normal: even
  EXPECT_TRUE(std::isnan(to_f32(to_f16(std::nanf("")))));
  EXPECT_EQ(to_f32(f16{0x0001}), 0x1p-24f);
  EXPECT_EQ(to_f32(f16{0xfc00}), -std::numeric_limits<float>::infinity());
}

TEST(F16, AllHalfValuesRoundTrip) {
  std::vector<f16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = uint16_t(i);
  std::vector<float> f(65536);
  convert(all.data(), f.data(), all.size());
  std::vector<f16> back(65536);
  convert(f.data(), back.data(), f.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(bits(f[i]), bits(to_f32(all[i]))) << i;
    const bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
    if (nan) ASSERT_TRUE(std::isnan(f[i]));
    else ASSERT_EQ(back[i].bits, i);
    ASSERT_EQ(back[i].bits, to_f16(f[i]).bits);
  }
}

TEST(F16, VectorMatchesScalarAndReference) {
  std::mt19937 rng(11);
  std::vector<float> x;
  for (int i = 0; i < 100000; ++i) {
    // Concentrate on the f16 range, including its subnormals.
    const uint32_t exponent = 100 + rng() % 50, mantissa = rng() & 0x7fffff, sign = rng() & 1;
    x.push_back(from_bits(sign << 31 | exponent << 23 | mantissa));
    x.push_back(from_bits(rng()));
  }
  std::vector<f16> v(x.size());
  convert(x.data(), v.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(v[i].bits, to_f16(x[i]).bits) << std::hex << bits(x[i]);
    if (std::isfinite(x[i]) && std::fabs(x[i]) < 65504.0f) {
      const int e = std::max(std::ilogb(x[i]), -14);
      const double expected = round_to_grid(x[i], std::ldexp(1.0, e - 10));
      ASSERT_EQ(double(to_f32(v[i])), expected) << std::hex << bits(x[i]);
    }
  }
}

}  // namespace
}  // namespace hyla
