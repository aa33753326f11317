#pragma once
// Synthetic long-context sequences mixed into training (TRAIN.json's "longctx", the context
// curriculum's long-range data): the evaluation suite's generators (eval/longctx_tasks.h), drawn
// from a seed stream derived from the training seed that `hyla eval longctx --seed` never reaches
// (its contamination check confirms it). Each sample fills the stage's seq_len and is laid out like
// an image record: the prompt gets no loss; the answer (longctx_answer) and <|endoftext|> do.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/data/image_batches.h"
#include "hyla/data/tokenizer.h"
#include "hyla/eval/longctx_tasks.h"

namespace hyla {

class LongCtxSampler {
 public:
  // Reads the haystack text; the tokenizer must outlive the sampler.
  LongCtxSampler(const std::vector<std::string>& tasks, const std::string& haystack_file, const Tokenizer& tokenizer,
                 uint64_t training_seed);
  // Samples of `seq_len` tokens (tasks drawn uniformly among `tasks` that fit it, depths
  // uniformly) until they hold `rows` rows, at least one sample. `tasks` names a subset of the
  // sampler's tasks; empty: all of them.
  void next(int64_t rows, int64_t seq_len, const std::vector<std::string>& tasks, ImageSequences& out);
  uint64_t drawn() const { return drawn_; }
  nlohmann::json state() const { return {{"drawn", drawn_}}; }
  void set_state(const nlohmann::json& state) { drawn_ = state.at("drawn").get<uint64_t>(); }

 private:
  const Tokenizer& tokenizer_;
  Haystack haystack_;
  std::vector<LongCtxTask> tasks_;
  uint64_t seed_;
  uint64_t drawn_ = 0;
  // By seq_len and task subset: the indexes of the tasks whose samples fit it.
  std::map<std::pair<int64_t, std::vector<std::string>>, std::vector<size_t>> fitting_;
};

}  // namespace hyla
