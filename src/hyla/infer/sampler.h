#pragma once
// Choosing the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k, top-p (nucleus) and min-p filters, from a seeded RNG.
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

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token from logits [vocab]; with `logprob`, also its log-probability under the
  // unfiltered softmax at temperature 1.
  int32_t sample(const float* logits, int64_t vocab, double* logprob = nullptr);

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused
  std::vector<double> probs_;                          // reused
};

}  // namespace hyla
