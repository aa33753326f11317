#pragma once
// Expert load balancing (SPEC §5): the load statistics of a step and the rules that move the
// balancing bias b between steps (quantile, bias_sign); the aux_loss baseline's term and gradient.
#include <cstdint>
#include <vector>

#include "hyla/model/config.h"
#include "hyla/model/router.h"

namespace hyla {

struct ExpertLoadStats {
  float max_over_mean = 0.0f;  // busiest expert's tokens over the mean (tokens·k / E); 0 without tokens
  int64_t dead_experts = 0;    // experts that received no token
  std::vector<int64_t> tokens_per_expert;
};

ExpertLoadStats load_stats_of(const std::vector<int64_t>& tokens_per_expert);

// The quantile rule's per-expert threshold is an exact selection over one process's tokens
// (kth_largest_per_column); with several processes, an estimate from a per-expert histogram of the
// same margins, all-reduced once per step.

// Bins per expert of the quantile rule's margin histogram, over the range the margins can take
// under the current bias (s ∈ [0, 1]: s_{t,e} − α_t ∈ [−1 − max b, 1 − min b]).
constexpr int64_t kHistogramBins = 1024;
// The `rank`-th largest (1-based) of the values a histogram counts (bins[i] over
// [lo + i·w, lo + (i+1)·w)), spreading each bin's values evenly over it.
float kth_largest_of_histogram(const int64_t* bins, int64_t n_bins, float lo, float w, int64_t rank);

// Collects the routing of a step's training forwards (all micro-batches) and, once per optimiser
// step, moves the bias by the configured rule; the new bias routes the next step's batches.
class LoadBalancer {
 public:
  LoadBalancer() = default;
  explicit LoadBalancer(const MoeConfig& config);

  // Records one forward's routing, made with `bias`: its loads always (the last forward's
  // statistics), and for a training forward also its contribution to the step's update.
  void record(const Routing& routing, const float* bias, bool training);
  // Once per optimiser step, in three parts so that every process's counts add up in one sum
  // (update_balancing in ffn.h): the step's counts as int64 values (the load per expert, the
  // tokens, and with `histograms` each expert's histogram of the quantile rule's margins over
  // kHistogramBins bins), their sum over the processes, then the rule applied to `bias` from the
  // summed counts, which starts the next step. Without histograms (one process) the quantile
  // rule selects exactly over this process's margins; with them it reads the threshold off the
  // summed histograms (SPEC §5's estimate across ranks).
  int64_t counts_size(bool histograms) const;
  void export_counts(const float* bias, bool histograms, int64_t* out) const;
  void update(float* bias, const int64_t* counts, bool histograms);
  // Forgets the step's training forwards without moving the bias (a skipped step).
  void discard();
  // The step's loads so far, or the last forward's when no training forward was recorded since update.
  ExpertLoadStats stats() const;

 private:
  Balancing rule_ = Balancing::None;
  int64_t experts_ = 0, k_ = 0;
  float bias_step_ = 0.0f;
  std::vector<int64_t> step_load_, last_load_;
  int64_t step_tokens_ = 0;
  // Quantile rule: s_{t,e} − α_t for each token of the step, [step_tokens_, E], where α_t is the
  // (k+1)-th largest of s_t + b (b is fixed within a step, so α_t is known at record time).
  std::vector<float> margins_;
  std::vector<float> columns_;     // the margins by expert for the exact thresholds; freed after each update
  std::vector<float> thresholds_;  // [E] β of the last update (exact, or from the summed histograms)
};

// aux_loss = coef · E · Σ_e f_e P_e with f_e = load_e / (tokens·k) (load: the routing's slots per
// expert) and P_e = mean over tokens of s_{t,e} / Σ_j s_{t,j}, over one forward's tokens: under
// gradient accumulation each micro-batch's term uses its own f and P (SPEC's "the step's" when a
// step is one forward).
float aux_loss_value(const Routing& routing, const int64_t* load, float coef);
// Adds scale · ∂aux_loss/∂s to d_scores [n, E] (f counts selections: no gradient).
void aux_loss_backward(const Routing& routing, const int64_t* load, float coef, float scale, float* d_scores);

}  // namespace hyla
