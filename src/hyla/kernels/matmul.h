#pragma once
// Dense matrix multiply on oneDNN: C = alpha * op(A) * op(B) + beta * C, row-major, with row
// strides (lda, ldb, ldc) as in BLAS. Inputs f32 or bf16, accumulation and output f32.
// Primitives are created once per shape and cached, so a training step never re-creates one.
// Products of a few rows with a transposed B (x · Wᵀ in decoding) go to skinny_gemm instead,
// which reads B once in its stored layout.
#include <cstdint>

#include "hyla/core/half.h"

namespace hyla {

enum class Trans : uint8_t { N, T };

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
          const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// `batch` independent products; matrix b of A starts at A + b * stride_a (likewise B and C). f32
// products of a few rows (op(A) = A) run on skinny_gemm or skinny_gemm_kn, split by product.
void gemm_batched(int64_t batch, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c);
void gemm_batched(int64_t batch, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const bf16* A, int64_t lda, int64_t stride_a, const bf16* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c);

// How measure_gemm_peak_gflops times a product. Wall: the benchmarks' in-run reference, slowed by
// whatever else runs. ProcessCpu: the process's CPU time over the thread count, the time its
// threads actually ran, so other processes taking the cores do not lower the figure (threads
// spinning at a barrier still count, which can only lower it).
enum class PeakClock : uint8_t { Wall, ProcessCpu };

// GFLOP/s of a 2048³ product on this machine now, the best of `repetitions` timed runs after an
// untimed one: the reference peak that benchmarks and MFU figures divide by.
double measure_gemm_peak_gflops(bool bf16_inputs, int repetitions = 3, PeakClock clock = PeakClock::Wall);

// Number of cached primitives (for tests that check a step creates none).
int64_t gemm_primitives_created();

}  // namespace hyla
