#include "hyla/train/optimizer_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

namespace hyla {

namespace {
constexpr std::pair<ScheduleType, const char*> kScheduleNames[] = {
    {ScheduleType::Constant, "constant"}, {ScheduleType::Cosine, "cosine"}, {ScheduleType::WarmupStableDecay, "wsd"}};
}  // namespace

const char* schedule_name(ScheduleType type) {
  for (const auto& [t, name] : kScheduleNames)
    if (t == type) return name;
  return "?";
}

std::optional<ScheduleType> schedule_from_name(const std::string& name) {
  for (const auto& [t, spelled] : kScheduleNames)
    if (name == spelled) return t;
  return std::nullopt;
}

void read_adamw(JsonFields& optimizer, OptimizerConfig& c) {
  optimizer.read("lr", c.lr);
  optimizer.read("beta1", c.beta1);
  optimizer.read("beta2", c.beta2);
  optimizer.read("eps", c.eps);
  optimizer.read("weight_decay", c.weight_decay);
}

nlohmann::json adamw_json(const OptimizerConfig& c) {
  return {{"lr", c.lr}, {"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps}, {"weight_decay", c.weight_decay}};
}

void validate_optimizer(const OptimizerConfig& c, const OptimizerKeys& keys, const std::string& source) {
  auto rule = [&](bool ok, const std::string& message) { HYLA_CHECK(ok, "{}: {}", source, message); };
  rule(c.lr > 0, fmt::format("optimizer.lr ({}) must be > 0", c.lr));
  rule(c.beta1 >= 0 && c.beta1 < 1, fmt::format("optimizer.beta1 ({}) must lie in [0, 1)", c.beta1));
  rule(c.beta2 >= 0 && c.beta2 < 1, fmt::format("optimizer.beta2 ({}) must lie in [0, 1)", c.beta2));
  rule(c.eps > 0, fmt::format("optimizer.eps ({}) must be > 0", c.eps));
  rule(c.weight_decay >= 0, fmt::format("optimizer.weight_decay ({}) must be >= 0", c.weight_decay));
  rule(c.grad_clip >= 0, fmt::format("{} ({}) must be >= 0", keys.grad_clip, c.grad_clip));
  rule(c.warmup_steps >= 0, fmt::format("{} ({}) must be >= 0", keys.warmup_steps, c.warmup_steps));
  rule(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1,
       fmt::format("{}.min_lr_ratio ({}) must lie in [0, 1]", keys.schedule, c.min_lr_ratio));
  rule(c.decay_fraction > 0 && c.decay_fraction <= 1,
       fmt::format("{}.decay_fraction ({}) must lie in (0, 1]", keys.schedule, c.decay_fraction));
}

double learning_rate(const OptimizerConfig& c, int64_t step, int64_t total_steps, double lr_scale) {
  const int64_t total = std::max<int64_t>(total_steps, 1);
  if (step < c.warmup_steps) return c.lr * lr_scale * double(step + 1) / double(c.warmup_steps);
  const double floor = c.min_lr_ratio;
  double shape = 1.0;
  if (c.schedule == ScheduleType::Cosine) {
    const double progress = std::clamp(double(step - c.warmup_steps) / double(std::max<int64_t>(total - 1 - c.warmup_steps, 1)), 0.0, 1.0);
    shape = floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
  } else if (c.schedule == ScheduleType::WarmupStableDecay) {
    const int64_t decay_steps = std::max<int64_t>(1, int64_t(std::llround(c.decay_fraction * double(total))));
    const int64_t decay_start = total - decay_steps;
    const double progress = std::clamp(double(step - decay_start + 1) / double(decay_steps), 0.0, 1.0);
    shape = step < decay_start ? 1.0 : 1.0 - (1.0 - floor) * progress;
  }
  return c.lr * lr_scale * shape;
}

}  // namespace hyla
