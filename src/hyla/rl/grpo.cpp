#include "hyla/rl/grpo.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "hyla/core/clock.h"
#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/core/threads.h"
#include "hyla/eval/agent_eval.h"
#include "hyla/infer/sampler.h"
#include "hyla/io/file.h"
#include "hyla/rl/agent_report.h"
#include "hyla/rl/rl_config.h"
#include "hyla/train/checkpoint.h"
#include "hyla/train/optimizer.h"
#include "hyla/train/train_step.h"

namespace hyla {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Rollouts packed into training inputs: row r of a trajectory predicts id r+1, scored only where
// the policy sampled it, with that trajectory's per-token weight.
struct Packed {
  std::vector<ModelInput> micro_batches;
  std::vector<std::vector<int64_t>> scored_rows;  // per micro-batch, the rows with a target
};

Packed pack(const std::vector<const Trajectory*>& rollouts, const std::vector<double>& advantages,
            int64_t micro_batch_tokens, double temperature) {
  Packed p;
  std::vector<int64_t> lengths;
  ModelInput in;
  auto close = [&] {
    if (lengths.empty()) return;
    in.tokens = TokenBatch::packed(lengths);
    std::vector<int64_t> rows;
    for (size_t r = 0; r < in.targets.size(); ++r)
      if (in.targets[r] >= 0) rows.push_back(int64_t(r));
    p.scored_rows.push_back(std::move(rows));
    in.temperature = float(temperature);  // the update scores the policy that sampled
    p.micro_batches.push_back(std::move(in));
    in = ModelInput{};
    lengths.clear();
  };
  for (size_t i = 0; i < rollouts.size(); ++i) {
    const Trajectory& t = *rollouts[i];
    const int64_t n = int64_t(t.ids.size()) - 1;
    if (!lengths.empty() && int64_t(in.ids.size()) + n > micro_batch_tokens) close();
    for (int64_t r = 0; r < n; ++r) {
      in.ids.push_back(t.ids[size_t(r)]);
      const bool scored = t.sampled[size_t(r) + 1] != 0;
      in.targets.push_back(scored ? t.ids[size_t(r) + 1] : -1);
      in.loss_weights.push_back(scored ? float(advantages[i]) : 0.0f);
    }
    lengths.push_back(n);
  }
  close();
  return p;
}

// The loss is a mean over every scored token of the batch, however it was split: the trainer
// divides micro-batch m's weighted sum by its own scored rows and by the number of micro-batches,
// so each weight is scaled by (rows of m × micro-batches / rows of the batch). Without it a short
// micro-batch's tokens would weigh more than a long one's.
void normalize_over_batch(Packed& p) {
  size_t total = 0;
  for (const auto& rows : p.scored_rows) total += rows.size();
  if (total == 0) return;
  for (size_t m = 0; m < p.micro_batches.size(); ++m) {
    const float scale = float(double(p.scored_rows[m].size()) * double(p.micro_batches.size()) / double(total));
    for (float& w : p.micro_batches[m].loss_weights) w *= scale;
  }
}

// The log-probability of each scored row's target under `model` at the batch's temperature (rows
// in Packed order).
std::vector<double> target_logprobs(Model& model, const ModelInput& batch, const std::vector<int64_t>& rows,
                                    Precision precision) {
  ModelInput in;
  in.tokens = batch.tokens;
  in.ids = batch.ids;
  ForwardResult out = model.forward(in, {.precision = precision, .outputs = Outputs::Rows, .rows = rows});
  const int64_t V = out.logits.dim(1);
  float* logits = out.logits.data<float>();
  if (batch.temperature != 1.0f)
    for (int64_t j = 0; j < int64_t(rows.size()) * V; ++j) logits[j] /= batch.temperature;
  std::vector<double> lp(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    lp[i] = log_probability(logits + int64_t(i) * V, V, batch.targets[size_t(rows[i])]);
  return lp;
}

}  // namespace

GroupAdvantages group_advantages(const std::vector<double>& rewards, int64_t group_size, bool std_normalize) {
  HYLA_ASSERT(group_size >= 1 && rewards.size() % size_t(group_size) == 0);
  GroupAdvantages g;
  g.advantages.assign(rewards.size(), 0.0);
  for (size_t first = 0; first < rewards.size(); first += size_t(group_size)) {
    double mean = 0, sq = 0;
    for (int64_t i = 0; i < group_size; ++i) mean += rewards[first + size_t(i)];
    mean /= double(group_size);
    for (int64_t i = 0; i < group_size; ++i) sq += (rewards[first + size_t(i)] - mean) * (rewards[first + size_t(i)] - mean);
    const double sd = std::sqrt(sq / double(group_size));
    const bool kept = sd > 1e-9;
    g.kept.push_back(kept);
    g.dropped += !kept;
    if (kept)
      for (int64_t i = 0; i < group_size; ++i)
        g.advantages[first + size_t(i)] = (rewards[first + size_t(i)] - mean) / (std_normalize ? sd + 1e-6 : 1.0);
  }
  return g;
}

double sampled_logprob(Model& model, const Trajectory& trajectory, Precision precision, double temperature) {
  const Packed packed = pack({&trajectory}, {0.0}, int64_t(trajectory.ids.size()), temperature);
  double sum = 0;
  for (size_t m = 0; m < packed.micro_batches.size(); ++m)
    for (double lp : target_logprobs(model, packed.micro_batches[m], packed.scored_rows[m], precision)) sum += lp;
  return sum;
}

StepResult grpo_update(Model& model, AdamW& optimizer, const RlConfig& rc, double lr,
                       const std::vector<const Trajectory*>& rollouts, const std::vector<double>& advantages,
                       Model* reference) {
  HYLA_ASSERT(rollouts.size() == advantages.size() && !rollouts.empty());
  HYLA_ASSERT((reference != nullptr) == (rc.kl_coef > 0));
  Packed packed = pack(rollouts, advantages, rc.micro_batch_tokens, rc.temperature);
  const StepSettings settings = rc.step_settings(int64_t(packed.micro_batches.size()));
  // The log-probabilities under the weights that sampled (for the ratio) and under the starting
  // model (for the KL penalty): one forward per micro-batch each.
  std::vector<std::vector<double>> old_lp, ref_lp;
  if (rc.epochs > 1 || reference)
    for (size_t m = 0; m < packed.micro_batches.size(); ++m) {
      old_lp.push_back(target_logprobs(model, packed.micro_batches[m], packed.scored_rows[m], rc.precision));
      if (reference) ref_lp.push_back(target_logprobs(*reference, packed.micro_batches[m], packed.scored_rows[m], rc.precision));
    }
  if (reference)  // the penalty's per-token estimate log(pi / pi_ref), folded into the weights
    for (size_t m = 0; m < packed.micro_batches.size(); ++m)
      for (size_t i = 0; i < packed.scored_rows[m].size(); ++i)
        packed.micro_batches[m].loss_weights[size_t(packed.scored_rows[m][i])] -=
            float(rc.kl_coef * (old_lp[m][i] - ref_lp[m][i]));
  normalize_over_batch(packed);
  const std::vector<ModelInput> base = packed.micro_batches;
  StepResult result;
  int64_t rows = 0;
  for (int64_t epoch = 0; epoch < rc.epochs; ++epoch) {
    // A reused batch: each weight times the ratio pi / pi_old, or 0 where the ratio left the clip
    // range in the advantage's direction (PPO's clipped surrogate has no gradient there).
    if (epoch > 0)
      for (size_t m = 0; m < packed.micro_batches.size(); ++m) {
        const std::vector<double> now = target_logprobs(model, base[m], packed.scored_rows[m], rc.precision);
        for (size_t i = 0; i < now.size(); ++i) {
          const size_t r = size_t(packed.scored_rows[m][i]);
          const double ratio = std::exp(now[i] - old_lp[m][i]);
          const float w = base[m].loss_weights[r];
          const bool clipped = (w > 0 && ratio > 1 + rc.clip_eps) || (w < 0 && ratio < 1 - rc.clip_eps);
          packed.micro_batches[m].loss_weights[r] = clipped ? 0.0f : float(w * ratio);
        }
      }
    result = train_step(model, optimizer, settings, lr, [&](int64_t m) { return packed.micro_batches[size_t(m)]; });
    rows += result.tokens;
  }
  result.tokens = rows;
  return result;
}

namespace {

// Resumes the run, or starts it (run.json, an empty metrics.jsonl); the step to continue from.
int64_t start_rl_run(const RlOptions& o, const RlConfig& rc, const fs::path& run_dir, Model& model, AdamW& optimizer) {
  if (o.resume) return resume_run(run_dir, model, optimizer, o.model_dir, /*lead=*/true).at("step").get<int64_t>();
  write_file_atomic(run_dir / "run.json",
                    json{{"rl", rc.to_json()}, {"model", fs::absolute(o.model_dir).string()}}.dump(2) + "\n");
  write_file_atomic(run_dir / "metrics.jsonl", "");
  return 0;
}

EngineOptions rollout_engine(const RlConfig& rc) {
  EngineOptions engine;
  engine.max_sequences = rc.max_sequences;
  engine.context = rc.limits.context;
  engine.precision = rc.precision;
  engine.prefix_cache_bytes = int64_t(512) << 20;
  engine.snapshot_interval = 256;
  return engine;
}

// Where a run's window of the train split's task stream starts: RL.json's seed picks it, so runs
// with different seeds see different tasks as well as draw different samples (a seed's claim then
// covers the task stream too). Below 2^40: task_seed keeps the split in the index's top bits.
uint64_t first_task_of(uint64_t seed) {
  uint64_t state = seed;
  return splitmix64(state) >> 24;
}

// Step `step`'s rollouts: tasks_per_step tasks of the stage's environments (in turn, from the
// seed's window of the train split), each played group_size times through the batching engine.
std::vector<Trajectory> play_rollouts(Scheduler& scheduler, const Tokenizer& tokenizer, const RlConfig& rc, int64_t step) {
  const int64_t stage = rc.stage_of(step);
  const AgentLimits limits = rc.limits_of(stage);
  std::vector<std::unique_ptr<Environment>> envs;
  for (const std::string& name : rc.curriculum[size_t(stage)].environments) envs.push_back(make_environment(name));
  std::vector<AgentSession> sessions;
  FaultConfig faults;
  faults.share = rc.fault_share;
  for (int64_t t = 0; t < rc.tasks_per_step; ++t) {
    const uint64_t index = first_task_of(rc.seed) + uint64_t(step * rc.tasks_per_step + t);
    for (int64_t g = 0; g < rc.group_size; ++g)
      sessions.emplace_back(*envs[index % envs.size()], Split::Train, index / envs.size(), faults, limits, tokenizer);
  }
  SamplingParams sampling;
  sampling.temperature = rc.temperature;
  sampling.seed = rc.seed * 0x9e3779b97f4a7c15ull + uint64_t(step) * 104729;
  run_agents(scheduler, sessions, sampling);
  std::vector<Trajectory> rollouts;
  for (AgentSession& s : sessions) rollouts.push_back(s.take());
  return rollouts;
}

// The update on the rollouts of the groups that teach something (none: no update).
std::optional<StepResult> update_on_kept_groups(Model& model, AdamW& optimizer, const RlConfig& rc, double lr,
                                                const std::vector<Trajectory>& rollouts, const GroupAdvantages& groups,
                                                Model* reference) {
  std::vector<const Trajectory*> kept;
  std::vector<double> advantages;
  for (size_t i = 0; i < rollouts.size(); ++i)
    if (groups.kept[i / size_t(rc.group_size)]) {
      kept.push_back(&rollouts[i]);
      advantages.push_back(groups.advantages[i]);
    }
  if (kept.empty()) return std::nullopt;
  return grpo_update(model, optimizer, rc, lr, kept, advantages, reference);
}

// The metrics row of a step's rollouts and update (metrics.jsonl, report.html).
json rl_metrics_row(int64_t step, int64_t stage, double lr, const RlConfig& rc, const std::vector<Trajectory>& rollouts,
                    int64_t dropped_groups, double rollout_seconds, const StepResult* update, double update_seconds) {
  int64_t correct = 0, generated = 0, steps_sum = 0, calls = 0, invalid = 0, transient_met = 0, transient_recovered = 0;
  int64_t transient_faults = 0, transient_retried = 0, prompt_read = 0;
  double reward_sum = 0;
  for (const Trajectory& r : rollouts) {
    reward_sum += r.reward;
    correct += r.correct();
    generated += r.generated_tokens;
    steps_sum += r.steps;
    calls += r.tool_calls;
    invalid += r.invalid_calls;
    prompt_read += r.prompt_tokens - r.cached_prompt_tokens;
    transient_faults += r.faults[0];
    transient_retried += r.transient_retried;
    if (r.faults[0] > 0) {
      ++transient_met;
      transient_recovered += r.correct();
    }
  }
  const double n = double(rollouts.size());
  const int64_t trained_rows = update ? update->tokens : 0;
  json row{{"step", step},
           {"stage", stage + 1},
           {"lr", lr},
           {"reward", reward_sum / n},
           {"pass", double(correct) / n},
           {"dropped_groups", double(dropped_groups) / double(rc.tasks_per_step)},
           {"mean_steps", double(steps_sum) / n},
           {"mean_tool_calls", double(calls) / n},
           {"invalid_call_rate", calls > 0 ? double(invalid) / double(calls) : 0.0},
           {"transient_recovery", transient_met > 0 ? json(double(transient_recovered) / double(transient_met)) : json(nullptr)},
           {"transient_retry", transient_faults > 0 ? json(double(transient_retried) / double(transient_faults)) : json(nullptr)},
           {"generated_tokens", generated},
           {"prompt_tokens_read", prompt_read},  // not restored from the prefix cache: rows the model ran besides decoding
           {"rollout_tok_s", double(generated) / rollout_seconds},
           {"update_tok_s", update_seconds > 0 ? double(trained_rows) / update_seconds : 0.0},
           {"rollout_s", rollout_seconds},
           {"update_s", update_seconds}};
  if (update) {
    row["loss"] = update->loss;
    row["grad_norm"] = update->grad_norm;
  }
  return row;
}

}  // namespace

void run_rl(const RlOptions& o) {
  const RlConfig rc = RlConfig::load(o.config);
  const fs::path run_dir(o.run_dir);
  prepare_run_directory(run_dir, o.resume, o.overwrite);
  const fs::path tokenizer_file = fs::path(o.model_dir) / "tokenizer.json";
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_file);
  std::unique_ptr<Model> model = Model::load(o.model_dir);
  std::unique_ptr<Model> reference;
  if (rc.kl_coef > 0) reference = Model::load(o.model_dir);
  AdamW optimizer(model->params(), rc.optimizer);
  int64_t step = start_rl_run(o, rc, run_dir, *model, optimizer);
  std::ofstream metrics(run_dir / "metrics.jsonl", std::ios::app);
  const EngineOptions engine = rollout_engine(rc);
  Scheduler scheduler(*model, tokenizer, engine);

  const int64_t total = rc.total_steps();
  fmt::print("rl: {} steps, {} tasks x {} rollouts per step, {} threads; model {}\n", total, rc.tasks_per_step,
             rc.group_size, num_threads(), o.model_dir);

  auto evaluate_dev = [&](int64_t stage) {
    AgentEvalOptions eo;
    eo.environments = rc.curriculum[size_t(stage)].environments;
    eo.split = Split::Dev;
    eo.tasks = rc.eval_tasks;
    eo.trials = 1;
    eo.sampling.temperature = 0;
    eo.faults.share = rc.fault_share;
    eo.limits = rc.limits_of(stage);
    eo.engine = engine;
    eo.progress = false;
    return summarize_agent_episodes(play_agent_tasks(*model, tokenizer, eo));
  };

  while (step < total) {
    const int64_t stage = rc.stage_of(step);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<Trajectory> rollouts = play_rollouts(scheduler, tokenizer, rc, step);
    const double rollout_seconds = seconds_since(t0);
    std::vector<double> rewards;
    for (const Trajectory& r : rollouts) rewards.push_back(r.reward);
    const GroupAdvantages groups = group_advantages(rewards, rc.group_size, rc.std_normalize);

    const auto t1 = std::chrono::steady_clock::now();
    const double lr = learning_rate(rc.optimizer, step, total, 1.0);
    const std::optional<StepResult> update =
        update_on_kept_groups(*model, optimizer, rc, lr, rollouts, groups, reference.get());
    if (update) scheduler.weights_changed();
    const double update_seconds = seconds_since(t1);
    ++step;

    json row = rl_metrics_row(step, stage, lr, rc, rollouts, groups.dropped, rollout_seconds, update ? &*update : nullptr,
                              update_seconds);
    const bool eval_now = rc.eval_every > 0 && (step % rc.eval_every == 0 || step == total);
    if (eval_now) {
      const json dev = evaluate_dev(stage);
      row["dev_pass@1"] = dev["all"]["pass@1"];
      for (const auto& [name, s] : dev.items())
        if (name != "all") row["dev_pass@1_" + name] = s["pass@1"];
    }
    metrics << row.dump() << "\n" << std::flush;
    if (!o.quiet || eval_now)
      fmt::print("step {:>4}/{} | reward {:.3f} | pass {:.3f} | dropped {:.2f} | steps {:.2f} | calls {:.2f} | "
                 "rollout {:.0f} tok/s | update {:.0f} tok/s{}\n",
                 step, total, row["reward"].get<double>(), row["pass"].get<double>(), row["dropped_groups"].get<double>(),
                 row["mean_steps"].get<double>(), row["mean_tool_calls"].get<double>(), row["rollout_tok_s"].get<double>(),
                 row["update_tok_s"].get<double>(),
                 eval_now ? fmt::format(" | dev pass@1 {:.3f}", row["dev_pass@1"].get<double>()) : "");
    if (rc.checkpoint_every > 0 && step % rc.checkpoint_every == 0 && step < total)
      save_checkpoint(run_dir, step, *model, optimizer, json{{"step", step}, {"bad_steps", 0}}, tokenizer_file,
                      rc.keep_checkpoints);
  }
  model->save(run_dir / "model", DType::F32, tokenizer_file);
  const fs::path report = write_rl_report(run_dir);
  fmt::print("saved {}; report {}\n", (run_dir / "model").string(), report.string());
}

}  // namespace hyla
