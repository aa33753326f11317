#pragma once
// RL.json: `hyla rl`'s group rollouts, update, long-horizon curriculum, evaluation and checkpoints
// (docs/agent.md). Parsed strictly: unknown keys and broken rules are errors naming the key.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/agent/agent.h"
#include "hyla/model/context.h"
#include "hyla/train/optimizer_config.h"

namespace hyla {

// A stage of the long-horizon curriculum: its environments, and budgets that grow stage by stage
// (more tool calls, longer trajectories).
struct RlStage {
  int64_t steps = 50;
  std::vector<std::string> environments;
  int64_t max_steps = 8;    // the episode's assistant turns
  int64_t max_tokens = 512; // generated tokens over the episode
};

struct RlConfig {
  uint64_t seed = 1;
  Precision precision = Precision::BF16;
  int64_t group_size = 8;       // rollouts per task (G)
  int64_t tasks_per_step = 4;   // groups per update
  double temperature = 1.0;
  double fault_share = 0.2;
  // AdamW at a constant rate after warmup; decoupled weight decay (0 by default for fine-tuning).
  OptimizerConfig optimizer{.lr = 2e-5, .beta2 = 0.99, .weight_decay = 0, .schedule = ScheduleType::Constant, .warmup_steps = 5};
  bool std_normalize = false;   // advantages divided by the group's reward std as well
  double kl_coef = 0;           // > 0: a per-token KL penalty to the starting model in the reward
  int64_t epochs = 1;           // updates per batch of rollouts; > 1 clips the policy ratio
  double clip_eps = 0.2;
  int64_t micro_batch_tokens = 4096;
  int64_t max_sequences = 32;   // engine slots for the rollouts
  AgentLimits limits;           // per-episode guardrails; each stage overrides max_steps and max_tokens
  std::vector<RlStage> curriculum{RlStage{50, {"calculator"}, 8, 512}};
  int64_t eval_every = 20, eval_tasks = 16;  // dev pass@1 (greedy) per environment
  int64_t checkpoint_every = 20, keep_checkpoints = 2;

  static RlConfig from_json(const nlohmann::json& j, const std::string& source);
  static RlConfig load(const std::string& path);
  nlohmann::json to_json() const;
  int64_t total_steps() const;
  int64_t stage_of(int64_t step) const;
  AgentLimits limits_of(int64_t stage) const;
  // What train_step reads for an update of `micro_batches` micro-batches.
  StepSettings step_settings(int64_t micro_batches) const { return {precision, micro_batches, optimizer.grad_clip}; }
};

}  // namespace hyla
