#include "hyla/infer/sampler.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/error.h"

namespace hyla {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  HYLA_CHECK(params.temperature >= 0, "temperature must be >= 0, got {}", params.temperature);
  HYLA_CHECK(params.top_k >= 0, "top_k must be >= 0, got {}", params.top_k);
  HYLA_CHECK(params.top_p > 0 && params.top_p <= 1, "top_p must lie in (0, 1], got {}", params.top_p);
  HYLA_CHECK(params.min_p >= 0 && params.min_p <= 1, "min_p must lie in [0, 1], got {}", params.min_p);
}

int32_t Sampler::sample(const float* logits, int64_t vocab, double* logprob) {
  int32_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  auto logprob_of = [&](int32_t token) {
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i] - logits[best]));
    return double(logits[token] - logits[best]) - std::log(sum);
  };
  if (params_.temperature == 0) {
    if (logprob) *logprob = logprob_of(best);
    return best;
  }
  candidates_.clear();
  for (int64_t i = 0; i < vocab; ++i) candidates_.emplace_back(logits[i], int32_t(i));
  // Most likely first; equal logits keep the lower id first so results are deterministic.
  auto by_logit = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
    keep = size_t(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + int64_t(keep), candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Probabilities at the temperature over the kept candidates.
  std::vector<double>& p = probs_;
  p.assign(keep, 0.0);
  const double top = candidates_[0].first;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((candidates_[i].first - top) / params_.temperature);
  for (double& x : p) x /= sum;
  size_t n = keep;
  if (params_.min_p > 0)
    while (n > 1 && p[n - 1] < params_.min_p * p[0]) --n;
  if (params_.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < n; ++i) {
      mass += p[i];
      if (mass >= params_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += p[i];
  double u = rng_.uniform() * total;
  size_t chosen = n - 1;
  for (size_t i = 0; i < n; ++i) {
    u -= p[i];
    if (u < 0) {
      chosen = i;
      break;
    }
  }
  const int32_t token = candidates_[chosen].second;
  if (logprob) *logprob = logprob_of(token);
  return token;
}

}  // namespace hyla
