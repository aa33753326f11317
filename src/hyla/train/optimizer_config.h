#pragma once
// The optimiser settings that TRAIN.json and RL.json share: AdamW's, gradient clipping, and the
// learning-rate schedule (a linear warmup, then constant, cosine or warmup-stable-decay).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "hyla/model/context.h"

namespace hyla {

class JsonFields;

enum class ScheduleType { Constant, Cosine, WarmupStableDecay };
// As config files spell them: "constant", "cosine", "wsd".
const char* schedule_name(ScheduleType type);
std::optional<ScheduleType> schedule_from_name(const std::string& name);

struct OptimizerConfig {
  // AdamW (decoupled weight decay; SPEC §9's no-decay groups).
  double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // global L2 norm; 0 disables
  ScheduleType schedule = ScheduleType::Cosine;
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.1;    // the cosine and decay schedules' floor, as a fraction of lr
  double decay_fraction = 0.2;  // warmup-stable-decay: the final fraction of steps that decays
};

// What one optimiser step (train_step.h) reads besides the optimiser: the forwards' precision,
// the micro-batches it accumulates, and the clipping norm.
struct StepSettings {
  Precision precision = Precision::BF16;
  int64_t micro_batches = 1;
  double grad_clip = 1.0;  // global L2 norm; 0 disables
};

// Where a config file keeps the keys that lie outside its "optimizer" object, so that an error
// names the key as the file spells it.
struct OptimizerKeys {
  std::string grad_clip, warmup_steps, schedule;
};

// Reads AdamW's keys (lr, beta1, beta2, eps, weight_decay) from a file's "optimizer" object.
void read_adamw(JsonFields& optimizer, OptimizerConfig& config);
// The same keys as a file's "optimizer" object holds them.
nlohmann::json adamw_json(const OptimizerConfig& config);

// Every rule of the settings; an error names `source` and the key.
void validate_optimizer(const OptimizerConfig& config, const OptimizerKeys& keys, const std::string& source);

// The learning rate at optimiser step `step` (0-based) of `total_steps`: linear warmup, then
// constant, cosine decay to min_lr_ratio·lr at the last step, or warmup-stable-decay (flat, then
// linear decay over the last decay_fraction of the steps); times `lr_scale`.
double learning_rate(const OptimizerConfig& config, int64_t step, int64_t total_steps, double lr_scale);

}  // namespace hyla
