#pragma once
#include <cstdint>

#include "hyla/train/train_config.h"

namespace hyla {

// The learning rate at optimiser step `step` (0-based): linear warmup, then cosine decay to
// min_lr_ratio·lr at the last step, or warmup-stable-decay (flat, then linear decay over the last
// decay_fraction of the steps); times the current curriculum stage's lr_scale.
double learning_rate(const TrainConfig& config, int64_t step);

}  // namespace hyla
