#pragma once
// Validation loss and perplexity of a model over a whole split of a prepared token directory
// (hyla data prepare): windows of T tokens read in order, so every token of a shard after its
// first is predicted exactly once, from at most T − 1 tokens of context.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "hyla/model/model.h"

namespace hyla {

struct PerplexityResult {
  double loss = 0;     // mean cross-entropy, nats per predicted token
  int64_t tokens = 0;  // predicted tokens
  double seconds = 0;
  double perplexity() const { return std::exp(loss); }
};

// Batches of `batch` windows of `seq_len` tokens; a progress bar on stderr when `progress`.
PerplexityResult evaluate_perplexity(Model& model, const std::filesystem::path& data_dir, const std::string& split,
                                     int64_t seq_len, int64_t batch, Precision precision, bool progress);

}  // namespace hyla
