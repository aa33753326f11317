#include "hyla/train/agent_mix.h"

#include <fmt/format.h>

#include "hyla/core/error.h"
#include "hyla/core/random.h"

namespace hyla {

void append_trajectory(const Trajectory& t, ImageSequences& out) {
  HYLA_ASSERT(t.ids.size() >= 2 && t.sampled.size() == t.ids.size());
  for (size_t r = 0; r + 1 < t.ids.size(); ++r) {
    out.ids.push_back(t.ids[r]);
    out.targets.push_back(t.sampled[r + 1] ? t.ids[r + 1] : -1);
  }
  out.lengths.push_back(int64_t(t.ids.size()) - 1);
}

AgentDemoSampler::AgentDemoSampler(const std::vector<std::string>& environments, double fault_share,
                                   const Tokenizer& tokenizer, uint64_t training_seed)
    : tokenizer_(tokenizer) {
  for (const std::string& name : environments) environments_.push_back(make_environment(name));
  HYLA_CHECK(!environments_.empty(), "agent demonstrations need at least one environment");
  faults_.share = fault_share;
  limits_.max_steps = 32;
  limits_.max_tokens = 1 << 20;
  limits_.context = 1 << 20;
  limits_.max_consecutive_failures = 8;
  // Task indexes far from 0, where `hyla rl` starts drawing the train split, per training seed.
  uint64_t state = hash_string(fmt::format("hyla-agent-demos|{}", training_seed));
  first_index_ = splitmix64(state) >> 16;
}

void AgentDemoSampler::next(int64_t rows, ImageSequences& out) {
  out.clear();
  do {
    const Environment& env = *environments_[drawn_ % environments_.size()];
    AgentSession session(env, Split::Train, first_index_ + drawn_ / environments_.size(), faults_, limits_, tokenizer_);
    ++drawn_;
    run_expert(session);
    // Only demonstrations that end right: one that hit its fallback shows nothing worth imitating,
    // and one a silent fault made wrong would teach the model to copy a wrong number into its answer.
    if (session.trajectory().correct()) append_trajectory(session.trajectory(), out);
  } while (out.rows() < rows);
}

}  // namespace hyla
