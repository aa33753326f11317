#pragma once
// Validation loss and perplexity of a model over a split of a prepared token directory (hyla data
// prepare): windows of T tokens read in order, so every token of a shard after its first is
// predicted exactly once, from at most T − 1 tokens of context. The one evaluator: `hyla eval`
// reads the whole split, the trainer's periodic evaluation its first batches.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "hyla/model/model.h"

namespace hyla {

struct PerplexityResult {
  double loss = 0;     // mean cross-entropy, nats per predicted token
  int64_t tokens = 0;  // predicted tokens (0: loss is NaN)
  double seconds = 0;
  double perplexity() const { return std::exp(loss); }
};

// Batches of `batch` windows of `seq_len` tokens, at most `max_batches` of them (0: the whole
// split); a progress bar on stderr when `progress`.
PerplexityResult evaluate_perplexity(Model& model, const std::filesystem::path& data_dir, const std::string& split,
                                     int64_t seq_len, int64_t batch, Precision precision, bool progress,
                                     int64_t max_batches = 0);

}  // namespace hyla
