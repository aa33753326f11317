#pragma once
// The MoE's arithmetic around its expert products (SPEC §5): the router's selection and weights
// and their gradient, the routed output's backward, and the weighted sum of a token's expert rows.
#include <cstdint>

namespace hyla {

// Per token, the top-k of scores + bias ([n, experts] + [experts]) into `selected` ([n, k], best
// first; a tie goes to the lower expert id) and the weights w_i = scaling · s_i / Σ_top-k s from
// the unbiased scores into `weights` [n, k]. Tokens in parallel.
void select_experts(const float* scores, const float* bias, int64_t n, int64_t experts, int64_t k, float scaling,
                    int32_t* selected, float* weights);

// dL/ds [n, experts] (overwritten) from dL/dw [n, k] through the weights' normalisation, given the
// scores and what select_experts made of them; only the selected experts' entries are non-zero.
void routing_weights_backward(const float* scores, const int32_t* selected, const float* weights, int64_t n,
                              int64_t experts, int64_t k, float scaling, const float* d_weights, float* d_scores);

// y_t = Σ_i c_i · slot_rows[token_slot[t·k + i]] for each of `tokens` tokens (rows of `width`), the
// k slots added in order; c_i = slot_weight[slot], or 1 where slot_weight is nullptr. With
// `accumulate` the sum adds to y. Tokens in parallel.
void combine_expert_rows(const float* slot_rows, int64_t width, const int32_t* token_slot, const float* slot_weight,
                         int64_t tokens, int64_t k, bool accumulate, float* y);

// The backward through y_j = c_j · (h_j W_downᵀ) for `rows` slots, h_j and dh_j rows of `width`
// (packed). dh_j comes in as dL/dy_j W_down, the gradient of the unweighted output's h_j. Writes
// dL/dc_j = dh_j · h_j to d_weight[j], scales dh_j by c_j (now dL/dh_j) and writes
// weighted_h_j = c_j · h_j (the right operand of W_down's gradient). Runs on the calling thread:
// the experts' backward calls it per block from its own threads.
void routed_output_backward(const float* h, const float* routing_weight, int64_t rows, int64_t width, float* dh,
                            float* weighted_h, float* d_weight);

}  // namespace hyla
