#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hyla/core/memory.h"
#include "hyla/kernels/small_gemm.h"
#include "reference_ops.h"

namespace hyla {
namespace {

void check(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, float beta, bool bf16_inputs) {
  std::mt19937 rng(unsigned(M * 131 + N * 7 + K));
  std::normal_distribution<float> dist;
  const int64_t lda = (trans_a ? M : K) + 3, ldb = N + 5, ldc = N + 1;
  std::vector<float> A((trans_a ? K : M) * lda + 1), B(K * ldb + 1), C(M * ldc + 1);
  for (auto* v : {&A, &B, &C})
    for (float& x : *v) x = dist(rng);
  std::vector<float> got = C, expected = C;
  if (bf16_inputs) {
    auto scratch = allocate_aligned(size_t(small_gemm_bf16_scratch(M, N, K)));
    small_gemm_bf16(trans_a, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), ldc, scratch.get());
    reference::small_gemm_bf16(trans_a, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, expected.data(), ldc,
                               nullptr);
  } else {
    small_gemm(trans_a, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(), ldc);
    reference::small_gemm(trans_a, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, expected.data(), ldc);
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      ASSERT_NEAR(got[i * ldc + j], expected[i * ldc + j], 2e-5 * (std::sqrt(double(K)) * 3 + std::fabs(expected[i * ldc + j])))
          << "M=" << M << " N=" << N << " K=" << K << " trans=" << trans_a << " i=" << i << " j=" << j;
  // Nothing outside the M×N block is written.
  for (int64_t i = 0; i < M; ++i) ASSERT_EQ(got[i * ldc + N], C[i * ldc + N]);
}

TEST(SmallGemm, MatchesReferenceAcrossShapes) {
  for (bool trans : {false, true})
    for (int64_t M : {1, 5, 6, 7, 16, 33, 64})
      for (int64_t N : {1, 15, 16, 17, 48, 64, 65, 128, 130})
        for (int64_t K : {1, 2, 3, 16, 63, 128}) {
          check(trans, M, N, K, 1.0f, 0.0f, false);
          check(trans, M, N, K, -0.5f, 1.0f, true);
        }
  check(false, 64, 128, 128, 2.0f, 0.75f, false);
  check(true, 128, 128, 64, 1.0f, 1.0f, true);
}

// Packed operands: A as bf16 rows (a bf16 weight copy), B packed by pack_bf16_pairs or as bf16
// rows of Bᵀ transposed as 32-bit words; both give the product of the bf16-rounded inputs.
TEST(SmallGemm, Bf16PackedOperands) {
  for (int64_t M : {1, 6, 13})
    for (int64_t N : {1, 16, 33, 64, 130})
      for (int64_t K : {2, 16, 62}) {
        std::mt19937 rng(unsigned(M * 131 + N * 7 + K));
        std::normal_distribution<float> dist;
        const int64_t lda = K + 4, ldb = (N + 15) / 16 * 16 + 16, ldc = N + 1;
        std::vector<float> a(size_t(M * lda)), b(size_t(K * N)), c(size_t(M * ldc));
        for (auto* v : {&a, &b, &c})
          for (float& x : *v) x = dist(rng);
        std::vector<bf16> a16(a.size()), bt16(size_t(N * K));  // bt16: bf16 rows of Bᵀ
        convert(a.data(), a16.data(), a.size());
        for (int64_t k = 0; k < K; ++k)
          for (int64_t j = 0; j < N; ++j) bt16[size_t(j * K + k)] = to_bf16(b[size_t(k * N + j)]);
        std::vector<uint32_t> packed(size_t(K / 2 * ldb)), words(size_t(K / 2 * ldb));
        pack_bf16_pairs(b.data(), K, N, N, packed.data(), ldb);
        transpose(reinterpret_cast<const float*>(bt16.data()), N, K / 2, K / 2, reinterpret_cast<float*>(words.data()),
                  ldb);
        for (const auto* pairs : {&packed, &words}) {
          std::vector<float> got = c;
          small_gemm_bf16_packed(M, N, K, 0.5f, a16.data(), lda, pairs->data(), ldb, 2.0f, got.data(), ldc);
          std::vector<float> expected = c;
          reference::gemm(Trans::N, Trans::T, M, N, K, 0.5f, a16.data(), lda, bt16.data(), K, 2.0f, expected.data(),
                          ldc);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              const float want = expected[size_t(i * ldc + j)];
              ASSERT_NEAR(got[size_t(i * ldc + j)], want, 1e-5 * (std::sqrt(double(K)) + std::fabs(want)))
                  << M << "x" << N << "x" << K << " at " << i << "," << j;
            }
          for (int64_t i = 0; i < M; ++i) ASSERT_EQ(got[size_t(i * ldc + N)], c[size_t(i * ldc + N)]);
        }
      }
}

TEST(SmallGemm, Transpose) {
  for (int64_t rows : {1, 7, 16, 33})
    for (int64_t cols : {1, 15, 16, 19, 40}) {
      const int64_t ld_src = cols + 2, ld_dst = rows + 3;
      std::vector<float> a(size_t(rows * ld_src)), t(size_t(cols * ld_dst), -1.0f);
      for (size_t i = 0; i < a.size(); ++i) a[i] = float(i);
      transpose(a.data(), rows, cols, ld_src, t.data(), ld_dst);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(t[c * ld_dst + r], a[r * ld_src + c]) << rows << "x" << cols;
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = rows; r < ld_dst; ++r) ASSERT_EQ(t[c * ld_dst + r], -1.0f);  // padding untouched
    }
}

}  // namespace
}  // namespace hyla
