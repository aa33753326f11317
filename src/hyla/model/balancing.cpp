#include "hyla/model/balancing.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>

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

float kth_largest(float* values, int64_t n, int64_t rank) {
  std::nth_element(values, values + rank - 1, values + n, std::greater<float>());
  return values[rank - 1];
}

LoadBalancer::LoadBalancer(const MoeConfig& config)
    : rule_(config.balancing),
      experts_(config.num_experts),
      k_(config.num_experts_per_tok),
      bias_step_(float(config.bias_update_speed)),
      step_load_(size_t(experts_), 0),
      last_load_(size_t(experts_), 0) {}

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
  const float* s = routing.s();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    // α_t, the (k+1)-th largest of s_t + b, is the largest among the experts not selected (the
    // selection is exactly the top k; quantile balancing requires k < E).
    float alpha = -INFINITY;
    for (int64_t e = 0; e < E; ++e) {
      bool chosen = false;
      for (int64_t i = 0; i < k; ++i) chosen |= ids[t * k + i] == e;
      if (!chosen) alpha = std::max(alpha, s[t * E + e] + bias[e]);
    }
    float* margin = margins_.data() + (first + t) * E;
    for (int64_t e = 0; e < E; ++e) margin[e] = s[t * E + e] - alpha;
  }
}

void LoadBalancer::discard() {
  std::fill(step_load_.begin(), step_load_.end(), 0);
  step_tokens_ = 0;
  margins_.clear();
}

void LoadBalancer::update(float* bias, Collective& collective) {
  collective.sum(step_load_);
  const int64_t E = experts_, T = step_tokens_;
  if (rule_ == Balancing::Quantile && T > 0) {
    // β_e = the min(q+1, T)-th largest over the step's tokens of s_{t,e} − α_t, q = round(T·k/E):
    // with bias −β_e expert e alone would take its fair share q. b = −β, centred.
    const int64_t q = int64_t(std::floor(double(T) * double(k_) / double(E) + 0.5));
    const int64_t rank = std::min(q + 1, T);
    column_.resize(size_t(omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t e = 0; e < E; ++e) {
      std::vector<float>& column = column_[size_t(omp_get_thread_num())];
      column.resize(size_t(T));
      for (int64_t t = 0; t < T; ++t) column[size_t(t)] = margins_[size_t(t * E + e)];
      bias[e] = -kth_largest(column.data(), T, rank);
    }
    double mean = 0.0;
    for (int64_t e = 0; e < E; ++e) mean += bias[e];
    mean /= double(E);
    for (int64_t e = 0; e < E; ++e) bias[e] = float(bias[e] - mean);
  } else if (rule_ == Balancing::BiasSign) {
    int64_t total = 0;
    for (int64_t load : step_load_) total += load;
    const double mean_load = double(total) / double(E);
    for (int64_t e = 0; e < E; ++e) {
      const double gap = mean_load - double(step_load_[size_t(e)]);
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
  const float* s = routing.s();
  const double inv_slots = 1.0 / double(n * routing.k);
  // Σ_e f_e P_e = (1/n) Σ_t (f · s_t) / Σ_j s_{t,j}
  double sum = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (int64_t t = 0; t < n; ++t) {
    double f_dot_s = 0.0, total = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      f_dot_s += double(load[e]) * s[t * E + e];
      total += s[t * E + e];
    }
    sum += f_dot_s * inv_slots / total;
  }
  return float(coef * double(E) * sum / double(n));
}

void aux_loss_backward(const Routing& routing, const int64_t* load, float coef, float scale, float* d_scores) {
  const int64_t n = routing.tokens, E = routing.experts;
  const float* s = routing.s();
  const float inv_slots = 1.0f / float(n * routing.k);
  const float c = coef * float(E) / float(n) * scale;
  // ∂/∂s_{t,e} of (1/n) Σ_t (f · s_t)/Z_t is (f_e − (f · s_t)/Z_t) / (n Z_t), Z_t = Σ_j s_{t,j}.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    float f_dot_s = 0.0f, total = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      f_dot_s += float(load[e]) * inv_slots * s[t * E + e];
      total += s[t * E + e];
    }
    const float mean = f_dot_s / total, g = c / total;
    for (int64_t e = 0; e < E; ++e) d_scores[t * E + e] += g * (float(load[e]) * inv_slots - mean);
  }
}

}  // namespace hyla
