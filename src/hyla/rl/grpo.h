#pragma once
// `hyla rl`: full-trajectory GRPO over the tool environments.
// Each step plays tasks_per_step tasks G times each through the batching engine (each
// trajectory's prompt state reused across its turns by the prefix cache: a turn reads only what the
// last one added), scores them, and sets every rollout's advantage to its reward minus its group's
// mean (optionally over the group's std). Groups whose rewards are all equal teach nothing and are
// dropped (their share logged). The loss is token-level over the model's own sampled ids only
// (prompts and tool observations masked), ids kept exactly as sampled: per-row loss weights of
// the one training forward (train_step.h), normalised by the scored tokens of the whole batch
// (every token weighs the same, whichever micro-batch or rollout holds it). No KL term unless
// kl_coef > 0 (a per-token penalty towards the starting model, folded into the weights); the
// policy ratio is clipped only when a batch is reused (epochs > 1). After each update the engine is told the weights changed.
// Checkpoints and --resume as `hyla train`; metrics.jsonl and report.html in the run directory.
#include <string>
#include <vector>

#include "hyla/agent/agent.h"
#include "hyla/rl/rl_config.h"
#include "hyla/train/optimizer.h"
#include "hyla/train/train_step.h"

namespace hyla {

struct RlOptions {
  std::string config, model_dir, run_dir;
  bool resume = false, overwrite = false, quiet = false;
};

void run_rl(const RlOptions& options);

// Rewards of consecutive groups of `group_size` rollouts: advantage = reward − the group's mean
// (over its std too with std_normalize); a group whose rewards are all equal is dropped (kept
// false, advantages 0).
struct GroupAdvantages {
  std::vector<double> advantages;
  std::vector<bool> kept;  // per group
  int64_t dropped = 0;
};
GroupAdvantages group_advantages(const std::vector<double>& rewards, int64_t group_size, bool std_normalize);


// One policy update over the rollouts (rc.epochs optimiser steps, each over every rollout).
// `reference`: the starting model, needed exactly when rc.kl_coef > 0.
StepResult grpo_update(Model& model, AdamW& optimizer, const RlConfig& rc, double lr,
                       const std::vector<const Trajectory*>& rollouts, const std::vector<double>& advantages,
                       Model* reference);

// Σ log-probability of a trajectory's sampled ids under `model` at `temperature` (what an update
// at that sampling temperature moves).
double sampled_logprob(Model& model, const Trajectory& trajectory, Precision precision, double temperature);

}  // namespace hyla
