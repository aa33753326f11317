#include "hyla/infer/sampler.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/error.h"

namespace hyla {

namespace {
// Most likely first; equal logits keep the lower id first so results are deterministic.
bool more_likely(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

// The first of the largest logits (logits may be -inf, never all of them).
int32_t argmax(const float* logits, int64_t vocab) {
  int32_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  return best;
}
}  // namespace

void check_sampling(const SamplingParams& params) {
  HYLA_CHECK(std::isfinite(params.temperature) && params.temperature >= 0, "temperature must be a finite number >= 0, got {}",
             params.temperature);
  HYLA_CHECK(params.top_k >= 0, "top_k must be >= 0, got {}", params.top_k);
  HYLA_CHECK(params.top_p > 0 && params.top_p <= 1, "top_p must lie in (0, 1], got {}", params.top_p);
  HYLA_CHECK(params.min_p >= 0 && params.min_p <= 1, "min_p must lie in [0, 1], got {}", params.min_p);
  HYLA_CHECK(params.frequency_penalty >= -2 && params.frequency_penalty <= 2, "frequency_penalty must lie in [-2, 2], got {}",
             params.frequency_penalty);
  HYLA_CHECK(params.presence_penalty >= -2 && params.presence_penalty <= 2, "presence_penalty must lie in [-2, 2], got {}",
             params.presence_penalty);
  for (const auto& [token, bias] : params.logit_bias) {
    HYLA_CHECK(token >= 0, "logit_bias: token ids must be >= 0, got {}", token);
    HYLA_CHECK(bias >= -100 && bias <= 100, "logit_bias for token {} must lie in [-100, 100], got {}", token, bias);
  }
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { check_sampling(params); }

int32_t Sampler::sample(const float* logits, int64_t vocab, const uint8_t* allowed, int32_t banned) {
  const float* adjusted = adjust(logits, vocab, allowed);
  int32_t token = draw(adjusted, vocab);
  if (token == banned) {
    if (adjusted != adjusted_.data()) adjusted_.assign(logits, logits + vocab);
    adjusted_[size_t(banned)] = -INFINITY;
    token = draw(adjusted_.data(), vocab);
  }
  if (params_.frequency_penalty != 0 || params_.presence_penalty != 0) {
    if (drawn_count_.empty()) drawn_count_.assign(size_t(vocab), 0);
    if (drawn_count_[size_t(token)]++ == 0) drawn_.push_back(token);
  }
  return token;
}

const float* Sampler::adjust(const float* logits, int64_t vocab, const uint8_t* allowed) {
  if (!allowed && params_.logit_bias.empty() && drawn_.empty()) return logits;
  adjusted_.assign(logits, logits + vocab);
  for (const auto& [token, bias] : params_.logit_bias)
    if (token < vocab) adjusted_[size_t(token)] += bias;
  for (const int32_t token : drawn_)
    adjusted_[size_t(token)] -= float(params_.frequency_penalty * drawn_count_[size_t(token)] + params_.presence_penalty);
  if (allowed) {
    bool any = false;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!allowed[i]) adjusted_[size_t(i)] = -INFINITY;
      any = any || allowed[i];
    }
    HYLA_ASSERT(any);  // callers finish a sequence whose grammar allows nothing
  }
  return adjusted_.data();
}

int32_t Sampler::draw(const float* logits, int64_t vocab) {
  const int32_t best = argmax(logits, vocab);
  if (params_.temperature == 0 || params_.top_k == 1) return best;
  const double top = logits[best], inv_t = 1.0 / params_.temperature;
  // min-p is a threshold on the logit: p_i ≥ min_p·p_max  ⇔  z_i ≥ z_max + T·log(min_p). Tokens
  // below e^-40 of the top are dropped too: they can never be drawn from a double-precision sum.
  const double floor = top + params_.temperature * std::max(std::log(std::max(params_.min_p, 1e-300)), -40.0);
  if (params_.top_k == 0 && params_.top_p >= 1) {
    // Plain sampling: inverse CDF over the vocabulary in id order, two passes, no sort.
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i)
      if (logits[i] >= floor) sum += std::exp((logits[i] - top) * inv_t);
    double u = rng_.uniform() * sum;
    int32_t last = best;
    for (int64_t i = 0; i < vocab; ++i)
      if (logits[i] >= floor) {
        last = int32_t(i);
        u -= std::exp((logits[i] - top) * inv_t);
        if (u < 0) return int32_t(i);
      }
    return last;
  }
  candidates_.clear();
  for (int64_t i = 0; i < vocab; ++i)
    if (logits[i] >= floor) candidates_.emplace_back(logits[i], int32_t(i));
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
    keep = size_t(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + int64_t(keep), candidates_.end(), more_likely);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), more_likely);
  }
  std::vector<double>& p = probs_;
  p.assign(keep, 0.0);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((candidates_[i].first - top) * inv_t);
  size_t n = keep;
  if (params_.top_p < 1) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += p[i] / sum;
      if (mass >= params_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += p[i];
  double u = rng_.uniform() * total;
  for (size_t i = 0; i < n; ++i) {
    u -= p[i];
    if (u < 0) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

double log_probability(const float* logits, int64_t vocab, int32_t token, int top, std::vector<TokenLogprob>* best) {
  const double max = logits[argmax(logits, vocab)];
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - max);
  const double log_z = max + std::log(sum);
  if (top > 0 && best) {
    std::vector<std::pair<float, int32_t>> all(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) all[size_t(i)] = {logits[i], int32_t(i)};
    const int64_t k = std::min<int64_t>(top, vocab);
    std::partial_sort(all.begin(), all.begin() + k, all.end(), more_likely);
    best->clear();
    for (int64_t i = 0; i < k; ++i) best->push_back({all[size_t(i)].second, double(all[size_t(i)].first) - log_z});
  }
  return double(logits[token]) - log_z;
}

}  // namespace hyla
