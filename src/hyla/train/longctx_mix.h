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
  // Reads the haystack text; the tokenizer must outlive the sampler. `weights`: a task's chance of
  // being drawn relative to the others (1 for a task it does not name).
  LongCtxSampler(const std::vector<std::string>& tasks, const std::string& haystack_file, const Tokenizer& tokenizer,
                 uint64_t training_seed, const std::map<std::string, double>& weights = {});
  // Fails, naming the task, unless every one of `tasks` (a subset of the sampler's; empty: all of
  // them) fits a sequence of `seq_len` tokens (32 draws of each, since the size of a sample depends
  // on its drawn keys and values). A stage that lists a task it can never draw would otherwise
  // train without it in silence.
  void check_fit(int64_t seq_len, const std::vector<std::string>& tasks);
  // Samples of `seq_len` tokens (tasks drawn among `tasks` by weight, depths uniformly) until they
  // hold `rows` rows, at least one sample; a rare draw too long for the length is replaced by the
  // next. `tasks` as for check_fit, which it implies.
  void next(int64_t rows, int64_t seq_len, const std::vector<std::string>& tasks, ImageSequences& out);
  uint64_t drawn() const { return drawn_; }
  nlohmann::json state() const { return {{"drawn", drawn_}}; }
  void set_state(const nlohmann::json& state) { drawn_ = state.at("drawn").get<uint64_t>(); }

 private:
  const Tokenizer& tokenizer_;
  Haystack haystack_;
  std::vector<LongCtxTask> tasks_;
  std::vector<double> weights_;  // by task index
  uint64_t seed_;
  uint64_t drawn_ = 0;
  // The tasks a stage draws from: their indexes and cumulative weights.
  struct StageTasks {
    std::vector<size_t> tasks;
    std::vector<double> cumulative_weights;
  };
  const StageTasks& stage_tasks(int64_t seq_len, const std::vector<std::string>& tasks);
  std::map<std::pair<int64_t, std::vector<std::string>>, StageTasks> stages_;  // by seq_len and task list
};

}  // namespace hyla
