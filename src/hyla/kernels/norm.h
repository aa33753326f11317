#pragma once
// RMSNorm over rows: y = x / sqrt(mean(x²) + eps) ⊙ w (SPEC notation), and LayerNorm (a vision
// tower's, SPEC §7), each with its backward.
#include <cstdint>

#include "hyla/core/workspace.h"

namespace hyla {

// x, y: [rows, dim] with row strides ld_x, ld_y; w: [dim]; rstd (optional): [rows], saves
// 1/sqrt(mean(x²) + eps) for the backward. y may alias x.
void rmsnorm_forward(const float* x, int64_t ld_x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                     int64_t ld_y, float* rstd);

// Given dy, writes dx (row stride ld_dx; accumulates when accumulate_dx; dx may alias dy) and
// adds to dw [dim].
// rstd from the forward. Rows run in parallel; dw sums per-thread partials (in `workspace`) in a
// fixed order.
void rmsnorm_backward(const float* x, int64_t ld_x, const float* w, const float* rstd, const float* dy, int64_t ld_dy,
                      int64_t rows, int64_t dim, float* dx, int64_t ld_dx, bool accumulate_dx, float* dw,
                      Workspace& workspace);

// LayerNorm over rows: y = (x − μ) / sqrt(σ² + eps) ⊙ w + b, μ and σ² the row's mean and biased
// variance; b may be null (no bias). x, y: [rows, dim] with row strides ld_x, ld_y; stats
// (optional): [rows, 2], saves μ and 1/sqrt(σ² + eps) for the backward. y may alias x.
void layernorm_forward(const float* x, int64_t ld_x, const float* w, const float* b, int64_t rows, int64_t dim,
                       float eps, float* y, int64_t ld_y, float* stats);

// Given dy, writes dx (row stride ld_dx; accumulates when accumulate_dx; dx may alias dy) and adds
// to dw [dim] and, when not null, db [dim]. stats from the forward. Per-thread partials of dw and db
// (in `workspace`) are summed in a fixed order.
void layernorm_backward(const float* x, int64_t ld_x, const float* w, const float* stats, const float* dy,
                        int64_t ld_dy, int64_t rows, int64_t dim, float* dx, int64_t ld_dx, bool accumulate_dx,
                        float* dw, float* db, Workspace& workspace);

}  // namespace hyla
