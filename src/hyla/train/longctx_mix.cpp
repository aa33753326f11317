#include "hyla/train/longctx_mix.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/io/file.h"

namespace hyla {

LongCtxSampler::LongCtxSampler(const std::vector<std::string>& tasks, const std::string& haystack_file,
                               const Tokenizer& tokenizer, uint64_t training_seed,
                               const std::map<std::string, double>& weights)
    : tokenizer_(tokenizer),
      haystack_(read_file(haystack_file), tokenizer),
      seed_(hash_string(fmt::format("hyla-longctx-train|{}", training_seed))) {
  for (const std::string& name : tasks) {
    tasks_.push_back(longctx_task(name));
    const auto weight = weights.find(name);
    weights_.push_back(weight == weights.end() ? 1.0 : weight->second);
  }
}

const LongCtxSampler::StageTasks& LongCtxSampler::stage_tasks(int64_t seq_len, const std::vector<std::string>& tasks) {
  const auto known = stages_.find({seq_len, tasks});
  if (known != stages_.end()) return known->second;
  StageTasks stage;
  double sum = 0;
  for (size_t t = 0; t < tasks_.size(); ++t) {
    if (!tasks.empty() && std::find(tasks.begin(), tasks.end(), tasks_[t].name) == tasks.end()) continue;
    // A sample's size depends on its drawn keys and values: 32 draws (sized without their context,
    // which costs little) must all fit.
    try {
      for (int i = 0; i < 32; ++i)
        make_longctx_sample(tasks_[t], haystack_, tokenizer_, seq_len, i / 31.0, seed_, uint64_t(i), /*no_context=*/true);
    } catch (const LongCtxDoesNotFit& e) {
      throw Error(fmt::format("longctx: task {} does not fit a sequence of {} tokens (the stage's seq_len): {}; leave "
                              "it out of the stage's longctx_tasks",
                              tasks_[t].name, seq_len, e.what()));
    }
    stage.tasks.push_back(t);
    stage.cumulative_weights.push_back(sum += weights_[t]);
  }
  HYLA_CHECK(!stage.tasks.empty(), "longctx: none of the tasks {} is the sampler's", fmt::join(tasks, ", "));
  return stages_.emplace(std::pair{seq_len, tasks}, std::move(stage)).first->second;
}

void LongCtxSampler::check_fit(int64_t seq_len, const std::vector<std::string>& tasks) { stage_tasks(seq_len, tasks); }

void LongCtxSampler::next(int64_t rows, int64_t seq_len, const std::vector<std::string>& tasks, ImageSequences& out) {
  out.clear();
  const StageTasks& stage = stage_tasks(seq_len, tasks);
  const int32_t end = tokenizer_.special_id("<|endoftext|>");
  do {
    Rng rng(seed_ ^ (drawn_ * 0x9e3779b97f4a7c15ull));
    // One task draws nothing, so a single-task stream does not depend on the weights.
    const size_t pick = stage.tasks.size() > 1 ? rng.pick(stage.cumulative_weights) : 0;
    const LongCtxTask& task = tasks_[stage.tasks[pick]];
    LongCtxSample sample;
    try {
      sample = make_longctx_sample(task, haystack_, tokenizer_, seq_len, rng.uniform(), seed_, drawn_++);
    } catch (const LongCtxDoesNotFit&) {
      continue;  // a rare draw whose keys tokenise too long for a length its task fits: the next draw replaces it
    }
    std::vector<int32_t> ids = sample.prompt;
    const size_t scored_from = ids.size();
    tokenizer_.encode_append(longctx_answer(sample), false, ids);
    ids.push_back(end);
    HYLA_ASSERT(int64_t(ids.size()) <= seq_len + 1);
    for (size_t r = 0; r + 1 < ids.size(); ++r) {
      out.ids.push_back(ids[r]);
      out.targets.push_back(r + 1 < scored_from ? -1 : ids[r + 1]);
    }
    out.lengths.push_back(int64_t(ids.size()) - 1);
  } while (out.rows() < rows);
}

}  // namespace hyla
