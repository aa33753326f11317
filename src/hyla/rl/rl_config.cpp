#include "hyla/rl/rl_config.h"

#include <fmt/format.h>

#include "hyla/agent/environment.h"
#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"
#include "hyla/train/train_config.h"

namespace hyla {

using json = nlohmann::json;

RlConfig RlConfig::from_json(const json& j, const std::string& source) {
  RlConfig c;
  JsonFields f(j, source);
  int64_t seed = int64_t(c.seed);
  f.read("seed", seed);
  c.seed = uint64_t(seed);
  c.precision = read_precision(f);
  f.read("group_size", c.group_size);
  f.read("tasks_per_step", c.tasks_per_step);
  f.read("temperature", c.temperature);
  f.read("fault_share", c.fault_share);
  JsonFields opt = f.object("optimizer");
  read_adamw(opt, c.optimizer);
  opt.read("grad_clip", c.optimizer.grad_clip);
  opt.read("warmup_steps", c.optimizer.warmup_steps);
  opt.finish();
  f.read("std_normalize", c.std_normalize);
  f.read("kl_coef", c.kl_coef);
  f.read("epochs", c.epochs);
  f.read("clip_eps", c.clip_eps);
  f.read("micro_batch_tokens", c.micro_batch_tokens);
  f.read("max_sequences", c.max_sequences);
  if (f.has("limits")) c.limits = AgentLimits::from_json(f.raw("limits"), source);
  if (f.has("curriculum")) {
    const json& stages = f.raw("curriculum");
    HYLA_CHECK(stages.is_array() && !stages.empty(), "{}: curriculum must be a non-empty array of stages", source);
    c.curriculum.clear();
    for (size_t i = 0; i < stages.size(); ++i) {
      RlStage s;
      JsonFields sf(stages[i], source, fmt::format("curriculum[{}]", i));
      sf.read("steps", s.steps);
      sf.read("environments", s.environments);
      sf.read("max_steps", s.max_steps);
      sf.read("max_tokens", s.max_tokens);
      sf.finish();
      HYLA_CHECK(s.steps >= 1 && s.max_steps >= 1 && s.max_tokens >= 1 && !s.environments.empty(),
                 "{}: curriculum[{}] needs steps, max_steps and max_tokens of at least 1 and an environment", source, i);
      for (const std::string& name : s.environments) {
        try {
          make_environment(name);
        } catch (const Error& e) {
          fail("{}: curriculum[{}].environments: {}", source, i, e.what());
        }
      }
      c.curriculum.push_back(std::move(s));
    }
  }
  JsonFields eval = f.object("eval");
  eval.read("every", c.eval_every);
  eval.read("tasks", c.eval_tasks);
  eval.finish();
  JsonFields ckpt = f.object("checkpoint");
  ckpt.read("every", c.checkpoint_every);
  ckpt.read("keep", c.keep_checkpoints);
  ckpt.finish();
  f.finish();
  auto rule = [&](bool ok, const std::string& message) { HYLA_CHECK(ok, "{}: {}", source, message); };
  rule(c.group_size >= 2, fmt::format("group_size ({}) must be at least 2: advantages compare a group's rollouts", c.group_size));
  rule(c.tasks_per_step >= 1, "tasks_per_step must be at least 1");
  rule(c.temperature > 0, "temperature must be > 0 (rollouts sample)");
  rule(c.fault_share >= 0 && c.fault_share <= 1, "fault_share must lie in [0, 1]");
  validate_optimizer(c.optimizer, {"optimizer.grad_clip", "optimizer.warmup_steps", "optimizer"}, source);
  rule(c.kl_coef >= 0, "kl_coef must be >= 0");
  rule(c.epochs >= 1 && c.clip_eps > 0, "epochs must be at least 1 and clip_eps > 0");
  rule(c.micro_batch_tokens >= 64 && c.max_sequences >= 1, "micro_batch_tokens must be at least 64 and max_sequences at least 1");
  rule(c.eval_every >= 0 && c.eval_tasks >= 1, "eval.every must be >= 0 and eval.tasks >= 1");
  rule(c.checkpoint_every >= 0 && c.keep_checkpoints >= 1, "checkpoint.every must be >= 0 and checkpoint.keep >= 1");
  return c;
}

RlConfig RlConfig::load(const std::string& path) { return from_json(parse_json_file(path), path); }

json RlConfig::to_json() const {
  json stages = json::array();
  for (const RlStage& s : curriculum)
    stages.push_back({{"steps", s.steps}, {"environments", s.environments}, {"max_steps", s.max_steps}, {"max_tokens", s.max_tokens}});
  json optimizer_json = adamw_json(optimizer);
  optimizer_json["grad_clip"] = optimizer.grad_clip;  // RL.json keeps these inside "optimizer"
  optimizer_json["warmup_steps"] = optimizer.warmup_steps;
  return {{"seed", seed},
          {"precision", precision == Precision::F32 ? "f32" : "bf16"},
          {"group_size", group_size},
          {"tasks_per_step", tasks_per_step},
          {"temperature", temperature},
          {"fault_share", fault_share},
          {"optimizer", optimizer_json},
          {"std_normalize", std_normalize},
          {"kl_coef", kl_coef},
          {"epochs", epochs},
          {"clip_eps", clip_eps},
          {"micro_batch_tokens", micro_batch_tokens},
          {"max_sequences", max_sequences},
          {"limits", limits.to_json()},
          {"curriculum", stages},
          {"eval", {{"every", eval_every}, {"tasks", eval_tasks}}},
          {"checkpoint", {{"every", checkpoint_every}, {"keep", keep_checkpoints}}}};
}

int64_t RlConfig::total_steps() const {
  int64_t n = 0;
  for (const RlStage& s : curriculum) n += s.steps;
  return n;
}

int64_t RlConfig::stage_of(int64_t step) const {
  for (size_t i = 0; i < curriculum.size(); ++i) {
    if (step < curriculum[i].steps) return int64_t(i);
    step -= curriculum[i].steps;
  }
  return int64_t(curriculum.size()) - 1;
}

AgentLimits RlConfig::limits_of(int64_t stage) const {
  AgentLimits l = limits;
  l.max_steps = curriculum[size_t(stage)].max_steps;
  l.max_tokens = curriculum[size_t(stage)].max_tokens;
  return l;
}

}  // namespace hyla
