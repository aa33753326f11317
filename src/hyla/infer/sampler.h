#pragma once
// Choosing the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k, top-p (nucleus) and min-p filters, from a seeded RNG; and the log-probabilities that
// OpenAI-style `logprobs` report.
#include <cstdint>
#include <vector>

#include "hyla/core/random.h"

namespace hyla {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // keep the smallest set of tokens whose probability reaches top_p
  double min_p = 0.0;        // drop tokens below min_p × the most likely token's probability
  uint64_t seed = 0;
};

// Rejects parameters no sampler can use (negative or non-finite temperature, top_p outside (0, 1], ...).
void check_sampling(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token from logits [vocab]. Without top-k/top-p this is O(vocab) with no sort.
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused
  std::vector<double> probs_;                          // reused
};

struct TokenLogprob {
  int32_t token;
  double logprob;
};

// log softmax(logits)[token] at temperature 1; with top > 0, also fills `best` with the `top` most
// likely tokens, most likely first (equal logits: lower id first).
double log_probability(const float* logits, int64_t vocab, int32_t token, int top = 0,
                       std::vector<TokenLogprob>* best = nullptr);

}  // namespace hyla
