#include "hyla/train/longctx_mix.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/io/file.h"

namespace hyla {

LongCtxSampler::LongCtxSampler(const std::vector<std::string>& tasks, const std::string& haystack_file,
                               const Tokenizer& tokenizer, uint64_t training_seed)
    : tokenizer_(tokenizer),
      haystack_(read_file(haystack_file), tokenizer),
      seed_(hash_string(fmt::format("hyla-longctx-train|{}", training_seed))) {
  for (const std::string& name : tasks) tasks_.push_back(longctx_task(name));
}

void LongCtxSampler::next(int64_t rows, int64_t seq_len, const std::vector<std::string>& tasks, ImageSequences& out) {
  out.clear();
  std::vector<size_t>& fitting = fitting_[{seq_len, tasks}];
  if (fitting.empty()) {
    for (size_t t = 0; t < tasks_.size(); ++t) {
      if (!tasks.empty() && std::find(tasks.begin(), tasks.end(), tasks_[t].name) == tasks.end()) continue;
      try {
        make_longctx_sample(tasks_[t], haystack_, tokenizer_, seq_len, 0.5, seed_, 0);
        fitting.push_back(t);
      } catch (const Error&) {  // the task needs more than seq_len tokens: left out of this stage
      }
    }
    HYLA_CHECK(!fitting.empty(), "longctx: no task {}fits a sequence of {} tokens (the stage's seq_len)",
               tasks.empty() ? "" : fmt::format("of {} ", fmt::join(tasks, ", ")), seq_len);
  }
  const int32_t end = tokenizer_.special_id("<|endoftext|>");
  do {
    Rng rng(seed_ ^ (drawn_ * 0x9e3779b97f4a7c15ull));
    const LongCtxTask& task = tasks_[fitting[rng.below(fitting.size())]];
    const LongCtxSample sample =
        make_longctx_sample(task, haystack_, tokenizer_, seq_len, rng.uniform(), seed_, drawn_++);
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
