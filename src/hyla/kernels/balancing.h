#pragma once
// The arithmetic of expert load balancing (SPEC §5) over a step's routing: the quantile rule's
// margins, their per-expert histograms and thresholds, and the aux_loss baseline's term and
// gradient. Scores s [tokens, experts] are the router's σ(logits); `load` counts each expert's slots.
#include <cstdint>

namespace hyla {

// margins[t, e] = s_{t,e} − α_t, α_t the largest s_{t,e} + bias_e over the experts token t did not
// select (`selected` [tokens, k], the exact top k of s + bias; k < experts). Tokens in parallel.
void quantile_margins(const float* scores, const float* bias, const int32_t* selected, int64_t tokens, int64_t experts,
                      int64_t k, float* margins);

// counts[e, i] (overwritten) = the number of margins[t, e] in bin i of `bins` bins of width
// bin_width from lo; a margin outside the range counts in the nearest end bin. Experts in parallel.
void margin_histograms(const float* margins, int64_t tokens, int64_t experts, float lo, float bin_width, int64_t bins,
                       int64_t* counts);

// out[c] = the `rank`-th largest (1-based, rank ≤ rows) of column c of values [rows, cols]. scratch
// holds rows × cols floats (the columns, transposed and reordered). Columns in parallel.
void kth_largest_per_column(const float* values, int64_t rows, int64_t cols, int64_t rank, float* scratch,
                            float* out);

// Σ_t (f · s_t) / Z_t with f_e = load_e / (tokens · k) and Z_t = Σ_e s_{t,e}, summed in double in
// a fixed order (the same value for any number of threads).
double aux_loss_sum(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k);

// d_scores[t, e] += c · (f_e − (f · s_t)/Z_t) / Z_t: the gradient of c · aux_loss_sum. Tokens in parallel.
void aux_loss_sum_backward(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k,
                           float c, float* d_scores);

}  // namespace hyla
