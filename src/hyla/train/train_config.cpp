#include "hyla/train/train_config.h"

#include <cmath>

#include "hyla/agent/environment.h"
#include "hyla/core/error.h"
#include "hyla/eval/longctx_tasks.h"
#include "hyla/io/json_fields.h"

namespace hyla {
using json = nlohmann::json;

Precision read_precision(JsonFields& f) {
  std::string precision = "bf16";
  f.read("precision", precision);
  if (precision != "bf16" && precision != "f32") f.fail_rule("precision must be \"bf16\" or \"f32\", got \"" + precision + "\"");
  return precision == "bf16" ? Precision::BF16 : Precision::F32;
}

TrainConfig TrainConfig::from_json(const json& j, const std::string& source) {
  TrainConfig c;
  JsonFields f(j, source);
  int64_t seed = int64_t(c.seed);
  f.read("seed", seed);
  c.seed = uint64_t(seed);
  std::string schedule = schedule_name(c.optimizer.schedule);
  c.precision = read_precision(f);

  JsonFields opt = f.object("optimizer");
  read_adamw(opt, c.optimizer);
  opt.finish();
  f.read("grad_clip", c.optimizer.grad_clip);
  f.read("grad_accum", c.grad_accum);

  JsonFields sched = f.object("schedule");
  sched.read("type", schedule);
  const std::optional<ScheduleType> type = schedule_from_name(schedule);
  if (!type) sched.fail_rule("schedule.type must be \"cosine\", \"wsd\" or \"constant\", got \"" + schedule + "\"");
  c.optimizer.schedule = *type;
  sched.read("warmup_steps", c.optimizer.warmup_steps);
  sched.read("min_lr_ratio", c.optimizer.min_lr_ratio);
  sched.read("decay_fraction", c.optimizer.decay_fraction);
  sched.finish();

  if (f.has("curriculum")) {
    const json& stages = f.raw("curriculum");
    if (!stages.is_array() || stages.empty()) f.fail_rule("curriculum must be a non-empty list of stages");
    c.curriculum.clear();
    for (size_t i = 0; i < stages.size(); ++i) {
      JsonFields s(stages[i], source, "curriculum[" + std::to_string(i) + "]");
      CurriculumStage stage;
      s.read("seq_len", stage.seq_len);
      s.read("tokens", stage.tokens);
      s.read("batch_tokens", stage.batch_tokens);
      s.read("lr_scale", stage.lr_scale);
      s.read("longctx_ratio", stage.longctx_ratio);
      s.read("longctx_tasks", stage.longctx_tasks);
      s.read("longctx_answer_share", stage.longctx_answer_share);
      s.finish();
      c.curriculum.push_back(stage);
    }
  }
  JsonFields eval = f.object("eval");
  eval.read("every", c.eval_every);
  eval.read("batches", c.eval_batches);
  eval.finish();
  JsonFields ckpt = f.object("checkpoint");
  ckpt.read("every", c.checkpoint_every);
  ckpt.read("keep", c.keep_checkpoints);
  ckpt.finish();
  f.read("log_every", c.log_every);
  JsonFields sample = f.object("sample");
  sample.read("every", c.sample_every);
  sample.read("tokens", c.sample_tokens);
  sample.read("prompt", c.sample_prompt);
  sample.read("temperature", c.sample_temperature);
  sample.finish();
  f.read("max_bad_steps", c.max_bad_steps);
  JsonFields images = f.object("images");
  images.read("ratio", c.image_ratio);
  images.read("weights", c.image_weights);
  if (images.has("augment")) {
    const json& entries = images.raw("augment");
    if (!entries.is_array()) images.fail_rule("images.augment must be a list with one object per --images directory");
    for (size_t i = 0; i < entries.size(); ++i) {
      JsonFields entry(entries[i], source, "images.augment[" + std::to_string(i) + "]");
      ImageAugment augment;
      entry.read("flip", augment.flip);
      entry.read("shift", augment.shift);
      entry.finish();
      c.image_augment.push_back(augment);
    }
  }
  images.finish();
  JsonFields longctx = f.object("longctx");
  longctx.read("ratio", c.longctx_ratio);
  longctx.read("tasks", c.longctx_tasks);
  longctx.read("haystack", c.longctx_haystack);
  longctx.read("answer_share", c.longctx_answer_share);
  if (longctx.has("weights")) {
    const json& weights = longctx.raw("weights");
    if (!weights.is_object()) longctx.fail_rule("longctx.weights must be an object: task name -> weight");
    for (const auto& [task, weight] : weights.items()) {
      if (!weight.is_number()) longctx.fail_rule(fmt::format("longctx.weights.{} must be a number", task));
      c.longctx_weights[task] = weight.get<double>();
    }
  }
  longctx.finish();
  JsonFields agent = f.object("agent");
  agent.read("ratio", c.agent_ratio);
  agent.read("environments", c.agent_environments);
  agent.read("fault_share", c.agent_fault_share);
  agent.finish();
  JsonFields dist = f.object("distributed");
  dist.read("zero_stage", c.zero_stage);
  dist.read("expert_parallel", c.expert_parallel);
  dist.read("bucket_mb", c.bucket_mb);
  dist.finish();
  f.finish();
  c.validate(source);
  return c;
}

TrainConfig TrainConfig::load(const std::string& path) { return from_json(parse_json_file(path), path); }

void TrainConfig::validate(const std::string& source) const {
  auto rule = [&](bool ok, const std::string& message) { HYLA_CHECK(ok, "{}: {}", source, message); };
  validate_optimizer(optimizer, {"grad_clip", "schedule.warmup_steps", "schedule"}, source);
  rule(grad_accum >= 1, fmt::format("grad_accum ({}) must be >= 1", grad_accum));
  for (size_t i = 0; i < curriculum.size(); ++i) {
    const CurriculumStage& s = curriculum[i];
    const std::string at = "curriculum[" + std::to_string(i) + "]";
    rule(s.seq_len > 0, fmt::format("{}.seq_len ({}) must be > 0", at, s.seq_len));
    rule(s.tokens > 0, fmt::format("{}.tokens ({}) must be > 0", at, s.tokens));
    rule(s.batch_tokens >= s.seq_len && s.batch_tokens % s.seq_len == 0,
         fmt::format("{}.batch_tokens ({}) must be a multiple of seq_len ({})", at, s.batch_tokens, s.seq_len));
    rule(s.sequences() % grad_accum == 0,
         fmt::format("{}: {} sequences per step do not split into grad_accum ({}) micro-batches", at, s.sequences(),
                     grad_accum));
    rule(s.lr_scale > 0, fmt::format("{}.lr_scale ({}) must be > 0", at, s.lr_scale));
    if (s.longctx_ratio != -1) {
      rule(longctx_ratio > 0,
           fmt::format("{}.longctx_ratio is set but longctx.ratio is 0: set longctx (ratio, tasks, haystack) first", at));
      rule(s.longctx_ratio >= 0 && s.longctx_ratio <= 64,
           fmt::format("{}.longctx_ratio ({}) must lie in [0, 64] (or -1: longctx.ratio)", at, s.longctx_ratio));
    }
    if (!s.longctx_tasks.empty())
      rule(longctx_ratio > 0,
           fmt::format("{}.longctx_tasks is set but longctx.ratio is 0: set longctx (ratio, tasks, haystack) first", at));
    if (s.longctx_answer_share != -1) {
      rule(longctx_ratio > 0,
           fmt::format("{}.longctx_answer_share is set but longctx.ratio is 0: set longctx (ratio, tasks, haystack) first", at));
      rule(s.longctx_answer_share > 0 && s.longctx_answer_share < 1,
           fmt::format("{}.longctx_answer_share ({}) must lie in (0, 1) (or -1: longctx.answer_share)", at,
                       s.longctx_answer_share));
    }
    for (const std::string& task : s.longctx_tasks)
      rule(std::find(longctx_tasks.begin(), longctx_tasks.end(), task) != longctx_tasks.end(),
           fmt::format("{}.longctx_tasks: '{}' is not in longctx.tasks ({})", at, task, fmt::join(longctx_tasks, ", ")));
  }
  rule(eval_every >= 0 && eval_batches >= 1, "eval.every must be >= 0 and eval.batches >= 1");
  rule(checkpoint_every >= 0 && keep_checkpoints >= 1, "checkpoint.every must be >= 0 and checkpoint.keep >= 1");
  rule(log_every >= 1, fmt::format("log_every ({}) must be >= 1", log_every));
  rule(sample_every >= 0 && sample_tokens >= 1, "sample.every must be >= 0 and sample.tokens >= 1");
  rule(sample_temperature >= 0, "sample.temperature must be >= 0");
  rule(max_bad_steps >= 1, fmt::format("max_bad_steps ({}) must be >= 1", max_bad_steps));
  rule(image_ratio >= 0 && image_ratio <= 64, fmt::format("images.ratio ({}) must lie in [0, 64]", image_ratio));
  for (double w : image_weights)
    rule(std::isfinite(w) && w > 0, fmt::format("images.weights ({}) must all be positive", fmt::join(image_weights, ", ")));
  for (size_t i = 0; i < image_augment.size(); ++i) {
    rule(image_augment[i].flip >= 0 && image_augment[i].flip <= 1,
         fmt::format("images.augment[{}].flip ({}) must lie in [0, 1]", i, image_augment[i].flip));
    rule(image_augment[i].shift >= 0 && image_augment[i].shift <= 64,
         fmt::format("images.augment[{}].shift ({}) must lie in [0, 64]", i, image_augment[i].shift));
  }
  rule(longctx_ratio >= 0 && longctx_ratio <= 64, fmt::format("longctx.ratio ({}) must lie in [0, 64]", longctx_ratio));
  rule(agent_ratio >= 0 && agent_ratio <= 64, fmt::format("agent.ratio ({}) must lie in [0, 64]", agent_ratio));
  rule(agent_fault_share >= 0 && agent_fault_share <= 1,
       fmt::format("agent.fault_share ({}) must lie in [0, 1]", agent_fault_share));
  if (agent_ratio > 0) {
    rule(!agent_environments.empty(), "agent.environments must name at least one environment when agent.ratio > 0");
    for (const std::string& name : agent_environments) {
      try {
        make_environment(name);
      } catch (const Error& e) {
        rule(false, fmt::format("agent.environments: {}", e.what()));
      }
    }
  }
  if (longctx_ratio > 0) {
    rule(!longctx_tasks.empty(), "longctx.tasks must name at least one task when longctx.ratio > 0");
    rule(!longctx_haystack.empty(), "longctx.haystack must name a text file when longctx.ratio > 0");
    for (const std::string& task : longctx_tasks) {
      try {
        longctx_task(task);
      } catch (const Error& e) {
        rule(false, fmt::format("longctx.tasks: {}", e.what()));
      }
    }
  }
  rule(longctx_answer_share == -1 || (longctx_answer_share > 0 && longctx_answer_share < 1),
       fmt::format("longctx.answer_share ({}) must lie in (0, 1) (or -1: every scored token counts once)",
                   longctx_answer_share));
  for (const auto& [task, weight] : longctx_weights) {
    rule(std::find(longctx_tasks.begin(), longctx_tasks.end(), task) != longctx_tasks.end(),
         fmt::format("longctx.weights: '{}' is not in longctx.tasks ({})", task, fmt::join(longctx_tasks, ", ")));
    rule(std::isfinite(weight) && weight > 0, fmt::format("longctx.weights.{} ({}) must be positive", task, weight));
  }
  rule(zero_stage == 0 || zero_stage == 1, fmt::format("distributed.zero_stage ({}) must be 0 or 1", zero_stage));
  rule(expert_parallel >= 1, fmt::format("distributed.expert_parallel ({}) must be >= 1", expert_parallel));
  rule(expert_parallel == 1 || zero_stage == 0, "distributed.zero_stage 1 does not combine with expert_parallel > 1 yet");
  rule(bucket_mb > 0 && bucket_mb <= 1024, fmt::format("distributed.bucket_mb ({}) must lie in (0, 1024]", bucket_mb));
}

double learning_rate(const TrainConfig& c, int64_t step) {
  return learning_rate(c.optimizer, step, c.total_steps(), c.curriculum[size_t(c.stage_of(step))].lr_scale);
}

int64_t TrainConfig::total_steps() const {
  int64_t n = 0;
  for (const CurriculumStage& s : curriculum) n += s.steps();
  return n;
}

int64_t TrainConfig::stage_start(int64_t stage) const {
  int64_t start = 0;
  for (int64_t i = 0; i < stage; ++i) start += curriculum[size_t(i)].steps();
  return start;
}

double TrainConfig::longctx_ratio_of(int64_t stage) const {
  const double own = curriculum[size_t(stage)].longctx_ratio;
  return own == -1 ? longctx_ratio : own;
}

const std::vector<std::string>& TrainConfig::longctx_tasks_of(int64_t stage) const {
  const std::vector<std::string>& own = curriculum[size_t(stage)].longctx_tasks;
  return own.empty() ? longctx_tasks : own;
}

double TrainConfig::longctx_answer_share_of(int64_t stage) const {
  const double own = curriculum[size_t(stage)].longctx_answer_share;
  return own == -1 ? longctx_answer_share : own;
}

int64_t TrainConfig::stage_of(int64_t step) const {
  int64_t end = 0;
  for (size_t i = 0; i < curriculum.size(); ++i) {
    end += curriculum[i].steps();
    if (step < end) return int64_t(i);
  }
  return int64_t(curriculum.size()) - 1;
}

json TrainConfig::to_json() const {
  json stages = json::array();
  for (const CurriculumStage& s : curriculum) {
    stages.push_back({{"seq_len", s.seq_len}, {"tokens", s.tokens}, {"batch_tokens", s.batch_tokens},
                      {"lr_scale", s.lr_scale}});
    if (s.longctx_ratio != -1) stages.back()["longctx_ratio"] = s.longctx_ratio;
    if (!s.longctx_tasks.empty()) stages.back()["longctx_tasks"] = s.longctx_tasks;
    if (s.longctx_answer_share != -1) stages.back()["longctx_answer_share"] = s.longctx_answer_share;
  }
  json augment_json = json::array();
  for (const ImageAugment& a : image_augment) augment_json.push_back({{"flip", a.flip}, {"shift", a.shift}});
  return {{"seed", seed},
          {"precision", precision == Precision::BF16 ? "bf16" : "f32"},
          {"optimizer", adamw_json(optimizer)},
          {"grad_clip", optimizer.grad_clip},
          {"grad_accum", grad_accum},
          {"schedule",
           {{"type", schedule_name(optimizer.schedule)},
            {"warmup_steps", optimizer.warmup_steps},
            {"min_lr_ratio", optimizer.min_lr_ratio},
            {"decay_fraction", optimizer.decay_fraction}}},
          {"curriculum", stages},
          {"eval", {{"every", eval_every}, {"batches", eval_batches}}},
          {"checkpoint", {{"every", checkpoint_every}, {"keep", keep_checkpoints}}},
          {"log_every", log_every},
          {"sample",
           {{"every", sample_every}, {"tokens", sample_tokens}, {"prompt", sample_prompt},
            {"temperature", sample_temperature}}},
          {"max_bad_steps", max_bad_steps},
          {"images", {{"ratio", image_ratio}, {"weights", image_weights}, {"augment", augment_json}}},
          {"longctx",
           {{"ratio", longctx_ratio},
            {"tasks", longctx_tasks},
            {"haystack", longctx_haystack},
            {"weights", longctx_weights},
            {"answer_share", longctx_answer_share}}},
          {"agent", {{"ratio", agent_ratio}, {"environments", agent_environments}, {"fault_share", agent_fault_share}}},
          {"distributed", {{"zero_stage", zero_stage}, {"expert_parallel", expert_parallel}, {"bucket_mb", bucket_mb}}}};
}

}  // namespace hyla
