#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "hyla/core/threads.h"
#include "hyla/kernels/matmul.h"
#include "reference_ops.h"

namespace hyla {
namespace {

struct Case {
  Trans ta, tb;
  int64_t M, N, K, pad;  // pad: extra columns in each leading dimension
  float alpha, beta;
};

template <typename T>
void check(const Case& c, int64_t batch) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist;
  const int64_t a_rows = c.ta == Trans::N ? c.M : c.K, a_cols = c.ta == Trans::N ? c.K : c.M;
  const int64_t b_rows = c.tb == Trans::N ? c.K : c.N, b_cols = c.tb == Trans::N ? c.N : c.K;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const int64_t sa = a_rows * lda + 3, sb = b_rows * ldb + 5, sc = c.M * ldc + 1;
  std::vector<float> A(size_t(batch * sa)), B(size_t(batch * sb)), C(size_t(batch * sc));
  for (auto* v : {&A, &B, &C})
    for (float& x : *v) x = dist(rng);
  const auto input = [](float x) {
    if constexpr (std::is_same_v<T, bf16>) return to_bf16(x);
    else return x;
  };
  std::vector<T> At(A.size()), Bt(B.size());
  std::transform(A.begin(), A.end(), At.begin(), input);
  std::transform(B.begin(), B.end(), Bt.begin(), input);
  std::vector<float> expected = C;
  reference::gemm_batched(batch, c.ta, c.tb, c.M, c.N, c.K, c.alpha, At.data(), lda, sa, Bt.data(), ldb, sb, c.beta,
                          expected.data(), ldc, sc);
  if (batch == 1)
    gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, At.data(), lda, Bt.data(), ldb, c.beta, C.data(), ldc);
  else
    gemm_batched(batch, c.ta, c.tb, c.M, c.N, c.K, c.alpha, At.data(), lda, sa, Bt.data(), ldb, sb, c.beta, C.data(),
                 ldc, sc);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        const size_t at = size_t(b * sc + i * ldc + j);
        // f32 accumulation of K products of unit-variance terms: error ~ sqrt(K) * 2^-24 * |terms|.
        ASSERT_NEAR(C[at], expected[at], 1e-5 * (std::sqrt(double(c.K)) * 4 + std::fabs(expected[at])))
            << "b=" << b << " i=" << i << " j=" << j;
      }
}

const Case kCases[] = {
    {Trans::N, Trans::N, 17, 23, 31, 0, 1.0f, 0.0f}, {Trans::N, Trans::T, 64, 48, 80, 3, 1.0f, 0.0f},
    {Trans::T, Trans::N, 33, 65, 129, 1, 0.5f, 1.0f}, {Trans::T, Trans::T, 8, 5, 300, 2, -2.0f, 0.25f},
    {Trans::N, Trans::T, 1, 1, 1, 0, 1.0f, 1.0f},     {Trans::N, Trans::N, 5, 7, 0, 0, 1.0f, 0.5f},
};

TEST(Gemm, F32AllTransposesStridesAlphaBeta) {
  for (const Case& c : kCases) check<float>(c, 1);
}

TEST(Gemm, Bf16InputsF32Accumulate) {
  for (const Case& c : kCases) check<bf16>(c, 1);
}

TEST(Gemm, BatchedStrided) {
  for (const Case& c : kCases) {
    check<float>(c, 3);
    check<bf16>(c, 4);
  }
}

// f32 batches of a few rows (decode's per-head products) run on the skinny kernels, split by
// product: x · W for W [K, N] (skinny_gemm_kn, with N past its 128-value passes and a tail) and
// x · Wᵀ, with strides, alpha and beta.
TEST(Gemm, BatchedFewRowsOnTheSkinnyKernels) {
  const Case cases[] = {
      {Trans::N, Trans::N, 1, 128, 64, 0, 1.0f, 0.0f}, {Trans::N, Trans::N, 3, 150, 20, 2, -1.0f, 0.5f},
      {Trans::N, Trans::N, 4, 7, 9, 1, 0.5f, 1.0f},    {Trans::N, Trans::T, 1, 64, 128, 1, 1.0f, 0.0f},
      {Trans::N, Trans::T, 2, 33, 70, 3, 2.0f, 0.25f},
  };
  for (const Case& c : cases) check<float>(c, 8);
}

TEST(Gemm, PrimitivesAreCachedByShape) {
  std::vector<float> A(64 * 64, 1.0f), B(64 * 64, 1.0f), C(64 * 64);
  gemm(Trans::N, Trans::N, 64, 64, 64, 1.0f, A.data(), 64, B.data(), 64, 0.0f, C.data(), 64);
  const int64_t created = gemm_primitives_created();
  for (int i = 0; i < 10; ++i)
    gemm(Trans::N, Trans::N, 64, 64, 64, 1.0f, A.data(), 64, B.data(), 64, 0.0f, C.data(), 64);
  EXPECT_EQ(gemm_primitives_created(), created);
  EXPECT_EQ(C[0], 64.0f);
}

// oneDNN fixes a primitive's split of the work among threads when it is created: a product first
// run on one thread gets a primitive of its own when two are there (else it stays on one).
TEST(Gemm, PrimitivesAreCachedPerThreadCount) {
  const ThreadConfig before = thread_config();
  std::vector<float> A(96 * 96, 1.0f), B(96 * 96, 1.0f), C(96 * 96);
  const auto product = [&] { gemm(Trans::N, Trans::N, 96, 96, 96, 1.0f, A.data(), 96, B.data(), 96, 0.0f, C.data(), 96); };
  set_threads(1);
  product();
  const int64_t created = gemm_primitives_created();
  set_threads(2);
  product();
  EXPECT_EQ(gemm_primitives_created(), created + 1);
  set_threads(1);
  product();
  EXPECT_EQ(gemm_primitives_created(), created + 1);  // each count's primitive is kept
  EXPECT_EQ(C[0], 96.0f);
  set_thread_config(before);
}

}  // namespace
}  // namespace hyla
