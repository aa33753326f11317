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

// The bf16 product on operands already in the kernel's packed layouts, for callers that keep them
// (a bf16 weight copy is already A's layout): A as bf16 rows, A[i][k] at A[i·lda + k] with K and
// lda even, so that each pair (k, k+1) is one 32-bit word; B as 32-bit pairs, (B[2p][j],
// B[2p+1][j]) at B[p·ldb + j], with ldb ≥ N rounded up to 16 (whole 16-column vectors are read).
void small_gemm_bf16_packed(int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                            const uint32_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
// Packs a rows × cols f32 block (row stride ld) into B's pair layout (row stride ld_dst, which
// must be ≥ cols rounded up to 16; the padding columns are written as zeros); an odd last row
// pairs with zeros. Transposing bf16 rows as 32-bit words gives the same layout for the
// transposed matrix: word p of bf16 row j is the pair (Xᵀ[2p][j], Xᵀ[2p+1][j]).
void pack_bf16_pairs(const float* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* dst, int64_t ld_dst);

// dst[c * ld_dst + r] = src[r * ld_src + c] for an rows × cols block.
void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst);

}  // namespace hyla
