#pragma once
// Choosing the next token from logits: greedy (temperature 0) or sampling with temperature,
// top-k, top-p (nucleus) and min-p filters, from a seeded RNG, after OpenAI's logit bias and
// frequency/presence penalties and an optional mask of allowed tokens (a grammar's); and the
// log-probabilities that OpenAI-style `logprobs` report (of the model's own distribution).
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
  // OpenAI's definitions: a token's logit drops by frequency_penalty × the times this sampler has
  // drawn it, and by presence_penalty once it has been drawn at all; both in [-2, 2].
  double frequency_penalty = 0, presence_penalty = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit), in [-100, 100]
};

// Rejects parameters no sampler can use (negative or non-finite temperature, top_p outside (0, 1], ...).
void check_sampling(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token from logits [vocab] and remembers it for the penalties. `allowed`, when given,
  // flags [vocab] the tokens that may be drawn; at least one must be. Without top-k/top-p this is
  // O(vocab) with no sort.
  // `banned` (≥ 0) is never returned: drawn anyway, the draw is redone without it, so the common
  // case costs nothing beyond the plain draw.
  int32_t sample(const float* logits, int64_t vocab, const uint8_t* allowed = nullptr, int32_t banned = -1);

 private:
  const float* adjust(const float* logits, int64_t vocab, const uint8_t* allowed);
  int32_t draw(const float* logits, int64_t vocab);

  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused
  std::vector<double> probs_;                          // reused
  std::vector<float> adjusted_;                        // the logits after bias, penalties and mask
  std::vector<int32_t> drawn_count_;                   // per token, with penalties
  std::vector<int32_t> drawn_;                         // the distinct tokens drawn so far
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
