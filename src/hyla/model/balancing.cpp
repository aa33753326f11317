#include "hyla/model/balancing.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/error.h"
#include "hyla/kernels/balancing.h"

namespace hyla {

ExpertLoadStats load_stats_of(const std::vector<int64_t>& tokens_per_expert) {
  ExpertLoadStats stats;
  stats.tokens_per_expert = tokens_per_expert;
  int64_t total = 0, busiest = 0;
  for (int64_t load : tokens_per_expert) {
    total += load;
    busiest = std::max(busiest, load);
    stats.dead_experts += load == 0;
  }
  if (total > 0) stats.max_over_mean = float(double(busiest) * double(tokens_per_expert.size()) / double(total));
  return stats;
}

LoadBalancer::LoadBalancer(const MoeConfig& config)
    : rule_(config.balancing),
      experts_(config.num_experts),
      k_(config.num_experts_per_tok),
      bias_step_(float(config.bias_update_speed)),
      step_load_(size_t(experts_), 0),
      last_load_(size_t(experts_), 0),
      thresholds_(size_t(experts_), 0.0f) {}

void LoadBalancer::record(const Routing& routing, const float* bias, bool training) {
  const int64_t n = routing.tokens, E = experts_, k = k_;
  const int32_t* ids = routing.expert_ids();
  std::fill(last_load_.begin(), last_load_.end(), 0);
  for (int64_t i = 0; i < n * k; ++i) ++last_load_[size_t(ids[i])];
  if (!training) return;
  for (int64_t e = 0; e < E; ++e) step_load_[size_t(e)] += last_load_[size_t(e)];
  const int64_t first = step_tokens_;
  step_tokens_ += n;
  if (rule_ != Balancing::Quantile) return;
  margins_.resize(size_t(step_tokens_ * E));  // capacity stays across steps
  quantile_margins(routing.s(), bias, ids, n, E, k, margins_.data() + first * E);
}

void LoadBalancer::discard() {
  std::fill(step_load_.begin(), step_load_.end(), 0);
  step_tokens_ = 0;
  margins_.clear();
}

int64_t LoadBalancer::counts_size(bool histograms) const {
  return experts_ + 1 + (histograms && rule_ == Balancing::Quantile ? experts_ * kHistogramBins : 0);
}

namespace {
// The margins' range under `bias` (kHistogramBins's comment) and its bin width.
std::pair<float, float> histogram_range(const float* bias, int64_t experts) {
  const auto [low, high] = std::minmax_element(bias, bias + experts);
  const float lo = -1.0f - *high, hi = 1.0f - *low;
  return {lo, (hi - lo) / float(kHistogramBins)};
}
}  // namespace

void LoadBalancer::export_counts(const float* bias, bool histograms, int64_t* out) const {
  const int64_t E = experts_, T = step_tokens_;
  std::copy(step_load_.begin(), step_load_.end(), out);
  out[E] = T;
  if (!histograms || rule_ != Balancing::Quantile) return;
  const auto [lo, w] = histogram_range(bias, E);
  margin_histograms(margins_.data(), T, E, lo, w, kHistogramBins, out + E + 1);
}

float kth_largest_of_histogram(const int64_t* bins, int64_t n_bins, float lo, float w, int64_t rank) {
  int64_t above = 0;
  for (int64_t i = n_bins - 1; i >= 0; --i) {
    if (above + bins[i] >= rank) {
      const double within = (double(rank - above) - 0.5) / double(bins[i]);
      return float(double(lo) + double(w) * (double(i + 1) - within));
    }
    above += bins[i];
  }
  return lo;
}

void LoadBalancer::update(float* bias, const int64_t* counts, bool histograms) {
  const int64_t E = experts_, T = counts[E];
  if (rule_ == Balancing::Quantile && T > 0) {
    // β_e = the min(q+1, T)-th largest over the step's tokens of s_{t,e} − α_t, q = round(T·k/E):
    // with bias −β_e expert e alone would take its fair share q. b = −β, centred.
    const int64_t q = int64_t(std::floor(double(T) * double(k_) / double(E) + 0.5));
    const int64_t rank = std::min(q + 1, T);
    if (histograms) {
      const auto [lo, w] = histogram_range(bias, E);
      for (int64_t e = 0; e < E; ++e)  // the range came from the bias: read every threshold before moving it
        thresholds_[size_t(e)] = kth_largest_of_histogram(counts + E + 1 + e * kHistogramBins, kHistogramBins, lo, w, rank);
      for (int64_t e = 0; e < E; ++e) bias[e] = -thresholds_[size_t(e)];
    } else {
      HYLA_ASSERT(T == step_tokens_);
      columns_.resize(margins_.size());
      kth_largest_per_column(margins_.data(), T, E, rank, columns_.data(), thresholds_.data());
      std::vector<float>().swap(columns_);  // T·E floats per MoE layer would otherwise stay held between steps
      for (int64_t e = 0; e < E; ++e) bias[e] = -thresholds_[size_t(e)];
    }
    double mean = 0.0;
    for (int64_t e = 0; e < E; ++e) mean += bias[e];
    mean /= double(E);
    for (int64_t e = 0; e < E; ++e) bias[e] = float(bias[e] - mean);
  } else if (rule_ == Balancing::BiasSign) {
    int64_t total = 0;
    for (int64_t e = 0; e < E; ++e) total += counts[e];
    const double mean_load = double(total) / double(E);
    for (int64_t e = 0; e < E; ++e) {
      const double gap = mean_load - double(counts[e]);
      bias[e] += bias_step_ * float((gap > 0) - (gap < 0));
    }
  }
  std::fill(step_load_.begin(), step_load_.end(), 0);
  step_tokens_ = 0;
  margins_.clear();
}

ExpertLoadStats LoadBalancer::stats() const { return load_stats_of(step_tokens_ > 0 ? step_load_ : last_load_); }

float aux_loss_value(const Routing& routing, const int64_t* load, float coef) {
  const int64_t n = routing.tokens, E = routing.experts;
  if (n == 0) return 0.0f;
  // Σ_e f_e P_e = (1/n) Σ_t (f · s_t) / Σ_j s_{t,j}
  return float(coef * double(E) * aux_loss_sum(routing.s(), load, n, E, routing.k) / double(n));
}

void aux_loss_backward(const Routing& routing, const int64_t* load, float coef, float scale, float* d_scores) {
  const int64_t n = routing.tokens, E = routing.experts;
  aux_loss_sum_backward(routing.s(), load, n, E, routing.k, coef * float(E) / float(n) * scale, d_scores);
}

}  // namespace hyla
