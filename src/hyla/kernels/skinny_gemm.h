#pragma once
// y = alpha · x · Wᵀ + beta · y for a few rows of x (decode: one row per sequence), W [N, K]
// row-major as the model stores its weights. Decoding is bound by reading W once: these kernels
// stream each weight row exactly once for all rows of x, where a general GEMM would first pack W
// into its own layout (AVX-512: four rows at a time, 16 accumulators, one 16-way horizontal
// reduction per group; AVX2: one row at a time, one sequential stream, at most 8 accumulators in
// its 16 registers). Parallel over W's rows.
#include <cstdint>

#include "hyla/core/half.h"

namespace hyla {

constexpr int64_t kSkinnyMaxRows = 4;  // rows of x (M) the kernels take

void skinny_gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* x, int64_t ldx, const float* W,
                 int64_t ldw, float beta, float* y, int64_t ldy);
void skinny_gemm(int64_t M, int64_t N, int64_t K, float alpha, const bf16* x, int64_t ldx, const bf16* W,
                 int64_t ldw, float beta, float* y, int64_t ldy);

// y = alpha · x · W + beta · y for a few rows of x with W [K, N] row-major (not transposed: decode's
// per-head absorption of latent attention's kv_b into the query): W's rows are read in order,
// each scaled by x's value and added into the output rows, on the calling thread.
void skinny_gemm_kn(int64_t M, int64_t N, int64_t K, float alpha, const float* x, int64_t ldx, const float* W,
                    int64_t ldw, float beta, float* y, int64_t ldy);

}  // namespace hyla
