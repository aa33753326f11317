// skinny_gemm (decode products x · Wᵀ of 1–4 rows) against a double-precision reference, over
// shapes with row and column tails, strides, alpha and beta, in f32 and bf16; and gemm's dispatch.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "hyla/kernels/matmul.h"
#include "hyla/kernels/skinny_gemm.h"
#include "reference_ops.h"

namespace hyla {
namespace {

template <typename T>
void check(int64_t M, int64_t N, int64_t K, float alpha, float beta, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  const int64_t ldx = K + 3, ldw = K + 5, ldy = N + 7;
  std::vector<T> x(size_t(M * ldx)), W(size_t(N * ldw));
  for (auto* v : {&x, &W})
    for (T& e : *v) {
      if constexpr (std::is_same_v<T, float>) e = dist(rng);
      else e = to_bf16(dist(rng));
    }
  std::vector<float> y(size_t(M * ldy));
  for (auto& v : y) v = dist(rng);
  const std::vector<float> y0 = y;
  skinny_gemm(M, N, K, alpha, x.data(), ldx, W.data(), ldw, beta, y.data(), ldy);
  std::vector<float> ref = y0, scale(y0.size());
  reference::skinny_gemm(M, N, K, alpha, x.data(), ldx, W.data(), ldw, beta, ref.data(), ldy);
  // Σ_k |x_k w_k|, the scale of the rounding errors: the same product on the inputs' magnitudes.
  const auto magnitude = [](std::vector<T> v) {
    for (T& e : v) {
      if constexpr (std::is_same_v<T, float>) e = std::abs(e);
      else e.bits &= 0x7fff;
    }
    return v;
  };
  reference::skinny_gemm(M, N, K, 1.0f, magnitude(x).data(), ldx, magnitude(W).data(), ldw, 0.0f, scale.data(), ldy);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const size_t at = size_t(m * ldy + n);
      EXPECT_NEAR(y[at], ref[at], 1e-5 * (std::abs(alpha) * scale[at] + std::abs(beta * y0[at])) + 1e-6)
          << "M " << M << " N " << N << " K " << K << " at " << m << "," << n;
    }
  // The padding between rows of y is never written.
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = N; n < ldy && m * ldy + n < int64_t(y.size()); ++n) EXPECT_EQ(y[size_t(m * ldy + n)], y0[size_t(m * ldy + n)]);
}

TEST(SkinnyGemm, MatchesDoubleReferenceWithTailsStridesAlphaBeta) {
  unsigned seed = 1;
  for (int64_t M : {1, 2, 3, 4})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{1, 1}, {5, 7}, {17, 33}, {64, 128}, {131, 257}, {700, 515}}) {
      check<float>(M, N, K, 1.0f, 0.0f, seed++);
      check<float>(M, N, K, 0.5f, 1.0f, seed++);
      check<bf16>(M, N, K, 1.0f, 0.0f, seed++);
      check<bf16>(M, N, K, -2.0f, 0.25f, seed++);
    }
}

// gemm sends x · Wᵀ of ≤ 4 rows to skinny_gemm and larger products to oneDNN: both agree.
TEST(SkinnyGemm, GemmDispatchAgreesWithOneDnn) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  const int64_t N = 300, K = 200;
  std::vector<float> x(size_t(8 * K)), W(size_t(N * K)), a(size_t(8 * N)), b(size_t(8 * N));
  for (auto& v : x) v = dist(rng);
  for (auto& v : W) v = dist(rng);
  gemm(Trans::N, Trans::T, 3, N, K, 1.0f, x.data(), K, W.data(), K, 0.0f, a.data(), N);      // skinny
  gemm(Trans::N, Trans::T, 8, N, K, 1.0f, x.data(), K, W.data(), K, 0.0f, b.data(), N);      // oneDNN
  for (int64_t i = 0; i < 3 * N; ++i) EXPECT_NEAR(a[size_t(i)], b[size_t(i)], 1e-4f * (1 + std::abs(b[size_t(i)])));
}

}  // namespace
}  // namespace hyla
