#pragma once
// Block Attention Residuals' mixture over depth (SPEC §6), forward and backward. Per row r, over
// `count` sources V_n [rows, dim] (rows dim apart):
//   z_n = w · RMSNorm_γ(V_n[r]) = rstd(V_n[r]) · (V_n[r] · (w ⊙ γ))   (no 1/√d scale)
//   p = softmax_n(z),   out[r] = Σ_n p_n V_n[r]
#include <cstdint>

#include "hyla/core/workspace.h"

namespace hyla {

// query w and norm_weight γ: [dim]. Writes out [rows, dim] and the softmax weights p [rows, count],
// which the backward reads. Rows run in parallel.
void attn_res_forward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                      const float* norm_weight, float eps, float* weights, float* out, Workspace& workspace);

// Given d_out [rows, dim] and the forward's weights: adds dL/dV_n into source_grads[n] ([rows, dim]
// each, in the forward's order) and the gradients of w and γ into d_query and d_norm_weight [dim].
// Rows run in parallel; the parameter gradients sum per-thread partials (in `workspace`) in a fixed
// order.
void attn_res_backward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                       const float* norm_weight, float eps, const float* weights, const float* d_out,
                       float* const* source_grads, float* d_query, float* d_norm_weight, Workspace& workspace);

}  // namespace hyla
