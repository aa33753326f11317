#include "hyla/train/schedule.h"

#include <algorithm>
#include <cmath>

namespace hyla {

double learning_rate(const TrainConfig& c, int64_t step) {
  const int64_t total = std::max<int64_t>(c.total_steps(), 1);
  const double scale = c.curriculum[size_t(c.stage_of(step))].lr_scale;
  if (step < c.warmup_steps) return c.lr * scale * double(step + 1) / double(c.warmup_steps);
  const double floor = c.min_lr_ratio;
  double shape;
  if (c.schedule == ScheduleType::Cosine) {
    const double progress = std::clamp(double(step - c.warmup_steps) / double(std::max<int64_t>(total - 1 - c.warmup_steps, 1)), 0.0, 1.0);
    shape = floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
  } else {
    const int64_t decay_steps = std::max<int64_t>(1, int64_t(std::llround(c.decay_fraction * double(total))));
    const int64_t decay_start = total - decay_steps;
    const double progress = std::clamp(double(step - decay_start + 1) / double(decay_steps), 0.0, 1.0);
    shape = step < decay_start ? 1.0 : 1.0 - (1.0 - floor) * progress;
  }
  return c.lr * scale * shape;
}

}  // namespace hyla
