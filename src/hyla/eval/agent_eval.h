#pragma once
// Agents measured end to end (`hyla eval agent`, and `hyla rl`'s dev pass@1): tasks of a split
// played `trials` times each through the batching engine, then per environment:
// - pass@1 (the mean success over trials), with a 95% interval over tasks;
// - pass^k (all of k trials succeed) and pass@k (at least one of k does), k = 1 … trials, by the
//   unbiased estimators C(c,k)/C(n,k) and 1 − C(n−c,k)/C(n,k) of a task with c successes in n;
// - mean steps and tool calls, the invalid-call rate, recovery per fault kind (the success rate of
//   episodes that met such a fault, bounded by the task's own success rate), the retry rate (the
//   share of explicit transient faults whose call the policy made again, which then works), and
//   the guardrails' counters (episodes by status).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/data/tokenizer.h"
#include "hyla/model/model.h"
#include "hyla/agent/agent.h"

namespace hyla {

struct AgentEvalOptions {
  std::vector<std::string> environments;
  Split split = Split::Test;
  int64_t tasks = 25;   // per environment, indexes 0 … tasks−1 of the split
  int64_t trials = 16;  // episodes per task
  SamplingParams sampling;  // trials differ by seed; temperature 0 makes them equal
  FaultConfig faults;
  AgentLimits limits;
  EngineOptions engine;
  bool progress = true;
};

// Plays every (environment, task, trial) episode, each sampling from its own seed (derived from
// sampling.seed and its place), in the order environment, task, trial.
std::vector<Trajectory> play_agent_tasks(Model& model, const Tokenizer& tokenizer, const AgentEvalOptions& options);

// The metrics above from episodes grouped by (environment, index): one object per environment and
// "all" (environments pooled, each task weighing the same).
nlohmann::ordered_json summarize_agent_episodes(const std::vector<Trajectory>& episodes);

// The unbiased estimators for a task with c successes in n trials.
double pass_all_k(int64_t n, int64_t c, int64_t k);  // pass^k
double pass_any_k(int64_t n, int64_t c, int64_t k);  // pass@k

}  // namespace hyla
