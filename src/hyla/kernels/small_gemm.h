#pragma once
// Single-threaded GEMM for the small, cache-resident blocks inside hand-written kernels (KDA
// chunks: 16..256 rows, 16..256 columns). oneDNN's per-call overhead (several µs) would dominate
// products this small; these register-blocked AVX-512 kernels reach most of one core's peak.
// The caller parallelises (one call per thread, e.g. per (sequence, head)).
//
//   C[M×N] = alpha · op(A) · B + beta · C
//   op(A) = A (stored M×K, row stride lda) or Aᵀ (A stored K×M, row stride lda)
//   B stored K×N, row stride ldb (rows contiguous along N)
#include <cstdint>

#include "hyla/core/half.h"

namespace hyla {

void small_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same product with bf16-rounded inputs (round-to-nearest-even, denormals flushed) and f32
// accumulation, on AVX512_BF16 dot-product instructions. `scratch` holds the packed operands:
// at least small_gemm_bf16_scratch(M, N, K) bytes, 64-byte aligned.
void small_gemm_bf16(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc, void* scratch);
int64_t small_gemm_bf16_scratch(int64_t M, int64_t N, int64_t K);

// dst[c * ld_dst + r] = src[r * ld_src + c] for an rows × cols block.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);

}  // namespace hyla
