// Training: TRAIN.json validation, the schedules, an end-to-end run through the CLI (curriculum
// stages, evaluation, checkpoints, report), the exact resume after kill -9 in deterministic mode,
// and the NaN guard.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/rl/rl_config.h"
#include "hyla/train/train_config.h"
#include "hyla/train/train_step.h"
#include "model_test_util.h"
#include "text_fixtures.h"
#include "tiny_run.h"

extern char** environ;

namespace hyla {
namespace {

using json = nlohmann::json;
using test::metrics;
using test::tiny;

void expect_config_error(const json& j, const std::string& what) {
  try {
    TrainConfig::from_json(j, "t.json");
    FAIL() << "no error; expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(TrainConfig, ValidationNamesKeysAndRules) {
  EXPECT_NO_THROW(TrainConfig::from_json(json::object()));
  EXPECT_NO_THROW(TrainConfig::load((test::source_dir() / "configs/train-demo.json").string()));
  expect_config_error({{"optimiser", {{"lr", 1}}}}, "unknown key optimiser");
  expect_config_error({{"optimizer", {{"lr", -1}}}}, "optimizer.lr (-1) must be > 0");
  expect_config_error({{"precision", "fp16"}}, "precision must be");
  expect_config_error({{"schedule", {{"type", "linear"}}}}, "schedule.type must be");
  expect_config_error({{"curriculum", json::array({{{"seq_len", 256}, {"batch_tokens", 1000}}})}},
                      "curriculum[0].batch_tokens (1000) must be a multiple of seq_len (256)");
  expect_config_error({{"grad_accum", 3}, {"curriculum", json::array({{{"seq_len", 256}, {"batch_tokens", 1024}}})}},
                      "do not split into grad_accum (3)");
  expect_config_error({{"curriculum", json::array({{{"seq_len", 256}, {"epochs", 2}}})}}, "unknown key curriculum[0].epochs");
}

TEST(TrainConfig, SchedulesAndStages) {
  TrainConfig c = TrainConfig::from_json({{"optimizer", {{"lr", 1.0}}},
                                          {"schedule", {{"warmup_steps", 10}, {"min_lr_ratio", 0.1}}},
                                          {"curriculum", json::array({{{"seq_len", 4}, {"tokens", 400}, {"batch_tokens", 8}},
                                                                      {{"seq_len", 8}, {"tokens", 400}, {"batch_tokens", 8}, {"lr_scale", 0.5}}})}});
  EXPECT_EQ(c.total_steps(), 100);
  EXPECT_EQ(c.stage_of(49), 0);
  EXPECT_EQ(c.stage_of(50), 1);
  EXPECT_EQ(c.stage_start(1), 50);
  EXPECT_NEAR(learning_rate(c, 0), 0.1, 1e-12);   // warmup: (step + 1) / warmup
  EXPECT_NEAR(learning_rate(c, 9), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(c, 10), 1.0, 1e-12);  // cosine starts at the peak
  EXPECT_NEAR(learning_rate(c, 99), 0.1 * 0.5, 1e-9);  // the floor, times the last stage's scale
  c.optimizer.schedule = ScheduleType::WarmupStableDecay;
  c.optimizer.decay_fraction = 0.2;
  EXPECT_NEAR(learning_rate(c, 40), 1.0, 1e-12);       // stable
  EXPECT_NEAR(learning_rate(c, 79), 0.5, 1e-12);       // stable, stage 2 scale
  EXPECT_NEAR(learning_rate(c, 99), 0.1 * 0.5, 1e-9);  // decayed to the floor
  // "constant" (TRAIN.json's third type, RL.json's only one): warmup, then flat to the last step.
  const TrainConfig constant = TrainConfig::from_json({{"optimizer", {{"lr", 1.0}}},
                                                       {"schedule", {{"type", "constant"}, {"warmup_steps", 10}}},
                                                       {"curriculum", json::array({{{"seq_len", 4}, {"tokens", 400}, {"batch_tokens", 8}}})}});
  EXPECT_EQ(constant.to_json()["schedule"]["type"], "constant");
  EXPECT_NEAR(learning_rate(constant, 4), 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(constant, 10), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(constant, 49), 1.0, 1e-12);
  const RlConfig rl;  // lr 2e-5 after 5 warmup steps
  EXPECT_NEAR(learning_rate(rl.optimizer, 0, 100, 1.0), 2e-5 / 5, 1e-15);
  EXPECT_NEAR(learning_rate(rl.optimizer, 4, 100, 1.0), 2e-5, 1e-15);
  EXPECT_NEAR(learning_rate(rl.optimizer, 99, 100, 1.0), 2e-5, 1e-15);
  expect_config_error({{"schedule", {{"type", "linear"}}}}, "schedule.type must be \"cosine\", \"wsd\" or \"constant\"");
}

// The extracted step: micro-batches accumulate into one update; a non-finite step changes no weight.
TEST(TrainStep, AccumulatesMicroBatchesAndSkipsNonFiniteSteps) {
  Model model(test::nano_config());
  model.initialize(2);
  TrainConfig tc;
  tc.grad_accum = 2;
  AdamW optimizer(model.params(), tc.optimizer);
  std::mt19937 rng(4);
  const auto batch = [&](int64_t) {
    ModelInput in;
    in.tokens = TokenBatch::uniform(2, 9);
    for (int64_t r = 0; r < in.tokens.rows; ++r) in.ids.push_back(int32_t(rng() % 256)), in.targets.push_back(int32_t(rng() % 256));
    return in;
  };
  const std::vector<float> before(model.params().values(), model.params().values() + model.params().numel());
  const StepResult ok = train_step(model, optimizer, tc.step_settings(), 1e-3, batch);
  EXPECT_FALSE(ok.skipped);
  EXPECT_EQ(ok.tokens, 2 * 18);
  EXPECT_GT(ok.loss, 4.0);  // ≈ ln 256 for an untrained model
  EXPECT_NE(std::memcmp(before.data(), model.params().values(), before.size() * 4), 0);

  std::fill_n(model.params().values(), 256 * 64, NAN);  // the embedding table: every loss is NaN
  model.params().refresh_bf16();
  const std::vector<float> after(model.params().values(), model.params().values() + model.params().numel());
  const StepResult bad = train_step(model, optimizer, tc.step_settings(), 1e-3, batch);
  EXPECT_TRUE(bad.skipped);
  EXPECT_EQ(std::memcmp(after.data(), model.params().values(), after.size() * 4), 0);
}

// The data-parallel seam: two replicas that saw the same batch (a collective whose sums double
// every buffer) take exactly the step one process takes, gradients, loss and balancing loads
// included. (bias_sign balancing: the quantile rule across processes estimates its threshold from
// histograms, tested in test_moe.cpp.)
struct TwoIdenticalReplicas final : Collective {
  int rank() const override { return 0; }
  int size() const override { return 2; }
  template <typename T> static void twice(std::span<T> v) {
    for (T& x : v) x *= 2;
  }
  void sum(std::span<float> v) override { twice(v); }
  void sum(std::span<double> v) override { twice(v); }
  void sum(std::span<int64_t> v) override { twice(v); }
  void start_sum(std::span<float> v) override { twice(v), ++started; }
  void start_reduce_scatter(std::span<const float>, std::span<const int>, float*) override { ADD_FAILURE(); }
  void wait() override {}
  void all_gather(std::span<float>, std::span<const int>) override { ADD_FAILURE(); }
  void barrier() override {}
  void broadcast(std::string&) override {}
  void all_to_all(std::span<const int64_t>, std::span<int64_t>) override { ADD_FAILURE(); }
  void all_to_all_v(const float*, std::span<const int64_t>, float*, std::span<const int64_t>) override { ADD_FAILURE(); }
  std::unique_ptr<Collective> split(int) override { return nullptr; }
  double busy_seconds() const override { return 0; }
  int64_t bytes() const override { return 0; }
  int started = 0;
};

TEST(TrainStep, ReplicasSumTheirGradientsThroughTheCollective) {
  const auto batch = [](int64_t m) {
    ModelInput in;
    in.tokens = TokenBatch::uniform(2, 9);
    std::mt19937 rng(unsigned(m) + 5);
    for (int64_t r = 0; r < in.tokens.rows; ++r) in.ids.push_back(int32_t(rng() % 256)), in.targets.push_back(int32_t(rng() % 256));
    return in;
  };
  TrainConfig tc;
  tc.grad_accum = 2;
  ModelConfig config = test::nano_config();
  config.moe.balancing = Balancing::BiasSign;
  std::vector<std::vector<float>> after;
  std::vector<double> losses;
  TwoIdenticalReplicas two;
  for (bool replicas : {false, true}) {
    Model model(config);
    model.initialize(3);
    AdamW optimizer(model.params(), tc.optimizer);
    // Buckets of 64 KB: several, started while the backward runs.
    GradientReducer reducer(model.params(), two, nullptr, /*shard_optimizer=*/false, 1.0 / 16);
    for (int step = 0; step < 2; ++step)
      losses.push_back((replicas ? train_step(model, optimizer, tc.step_settings(), 1e-3, batch, reducer)
                                 : train_step(model, optimizer, tc.step_settings(), 1e-3, batch)).loss);
    after.emplace_back(model.params().values(), model.params().values() + model.params().numel());
    if (replicas) {
      EXPECT_EQ(reducer.traffic().all_reduce_bytes, 2 * model.params().numel() * 4);
    }
  }
  EXPECT_GT(two.started, 2);
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_EQ(losses[1], losses[3]);
  EXPECT_EQ(std::memcmp(after[0].data(), after[1].data(), after[0].size() * 4), 0);
}

// The gradient hook's promise: every gradient past the offset it reports is final.
TEST(Model, GradientHookReportsOnlyFinalGradients) {
  ModelConfig config = test::nano_config();
  Model model(config);
  model.initialize(4);
  ModelInput in;
  in.tokens = TokenBatch::uniform(2, 12);
  std::mt19937 rng(7);
  for (int64_t r = 0; r < in.tokens.rows; ++r) in.ids.push_back(int32_t(rng() % 256)), in.targets.push_back(int32_t(rng() % 256));
  const int64_t n = model.params().numel();
  const float* g = model.params().grads();
  std::vector<std::pair<int64_t, std::vector<float>>> reported;
  model.set_gradient_hook([&](int64_t offset) { reported.emplace_back(offset, std::vector<float>(g + offset, g + n)); });
  model.params().zero_grads();
  model.forward(in, ForwardOptions{.precision = Precision::F32, .backward = true});
  ASSERT_EQ(reported.size(), size_t(config.num_hidden_layers + 2));
  EXPECT_EQ(reported.back().first, 0);
  for (size_t i = 0; i < reported.size(); ++i) {
    if (i > 0) {
      EXPECT_LE(reported[i].first, reported[i - 1].first);
    }
    const auto& [offset, seen] = reported[i];
    EXPECT_EQ(std::memcmp(seen.data(), g + offset, seen.size() * 4), 0) << "offset " << offset;
  }
  EXPECT_LT(reported.front().first, n);  // the head's gradients come first
}

TEST(Train, RunsTheCurriculumEvaluatesCheckpointsAndReports) {
  const std::string out = (tiny().dir / "run").string();
  const auto r = test::run_hyla(tiny().args(out) + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stage 2/2: seq_len 64"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("unigram entropy"), std::string::npos);
  const auto rows = metrics(out);
  ASSERT_EQ(rows.size(), 12u);
  for (const char* key : {"step", "seq_len", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "moe"})
    EXPECT_TRUE(rows[0].contains(key)) << key;
  EXPECT_EQ(rows[0]["seq_len"], 32);
  EXPECT_EQ(rows[11]["seq_len"], 64);
  EXPECT_TRUE(rows[3].contains("val_loss"));
  EXPECT_FALSE(rows[4].contains("val_loss"));
  EXPECT_LT(rows[11]["loss"].get<double>(), rows[0]["loss"].get<double>());
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoints/step-00000012/trainer.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoints/step-00000009/model/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoints/step-00000006"));  // keep 2
  EXPECT_EQ(test::run_hyla("inspect " + out + "/model").exit_code, 0);
  ASSERT_EQ(test::run_hyla("report " + out).exit_code, 0);
  const std::string html = read_file(out + "/report.html");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("stage boundary"), std::string::npos);
  EXPECT_NE(html.find(">T=32<"), std::string::npos);  // each stage labelled with its length
  EXPECT_NE(html.find(">T=64<"), std::string::npos);
  EXPECT_NE(html.find("Expert load"), std::string::npos);
}

// The step line says what MFU is relative to and when the run will end; the start-up line says how
// that reference was measured.
TEST(Train, LogLinesNameTheMfuReferenceAndAnEta) {
  const std::string out = (tiny().dir / "logged").string();
  const auto r = test::run_hyla(tiny().args(out) + " --steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("MFU is relative to "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("oneDNN 2048^3 GEMMs at start-up, timed in CPU time per thread"), std::string::npos) << r.output;
  const size_t last = r.output.find("step      2/2 |");
  ASSERT_NE(last, std::string::npos) << r.output;
  const std::string line = r.output.substr(last, r.output.find('\n', last) - last);
  EXPECT_NE(line.find(" GFLOP/s | "), std::string::npos) << line;
  EXPECT_NE(line.find(" elapsed, eta 0s"), std::string::npos) << line;
}

// Bit-for-bit: a run killed with SIGKILL after its step-6 checkpoint and resumed gives the same
// loss at every step as an uninterrupted run.
TEST(Train, DeterministicResumeAfterKillIsBitwiseIdentical) {
  const std::string whole = (tiny().dir / "whole").string(), killed = (tiny().dir / "killed").string();
  ASSERT_EQ(test::run_hyla(tiny().args(whole) + " --deterministic --quiet").exit_code, 0);

  const std::string command = std::string(HYLA_BINARY) + " " + tiny().args(killed) + " --deterministic --quiet > /dev/null 2>&1";
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  // In a process group of its own, so that one kill(2) reaches the shell and hyla at once: a
  // `pkill -f` spawned from here took long enough on a loaded machine for the run to finish first.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, &attributes, const_cast<char**>(argv), environ), 0);
  posix_spawnattr_destroy(&attributes);
  // Wait until a step after the step-6 checkpoint is logged, then kill the process group.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(killed + "/checkpoints/step-00000006/trainer.json") && metrics(killed).size() >= 7) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(-pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_LT(metrics(killed).size(), 12u) << "the run finished before it could be killed";
  const auto r = test::run_hyla(tiny().args(killed) + " --deterministic --quiet --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos);
  const auto a = metrics(whole), b = metrics(killed);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["loss"].dump(), b[i]["loss"].dump()) << "step " << i + 1;  // exact: same bits, same text
    EXPECT_EQ(a[i]["grad_norm"].dump(), b[i]["grad_norm"].dump()) << "step " << i + 1;
  }
}

TEST(Train, NonFiniteStepsAreSkippedThenStopTheRun) {
  const std::string out = (tiny().dir / "nan").string();
  const auto r = test::run_hyla(tiny().args(out) + " --lr 1e30 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("step skipped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training stopped at step"), std::string::npos) << r.output;
}

// Without --resume a new run would lose its checkpoints to the old run's keep-N pruning, and a later
// --resume would continue the old run.
TEST(Train, ANewRunInAnOldRunDirectoryNeedsResumeOrOverwrite) {
  const std::string out = (tiny().dir / "reused").string();
  ASSERT_EQ(test::run_hyla(tiny().args(out) + " --steps 3 --quiet").exit_code, 0);
  ASSERT_TRUE(std::filesystem::exists(out + "/checkpoints/step-00000003/trainer.json"));
  auto r = test::run_hyla(tiny().args(out) + " --steps 3 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds checkpoints of an earlier run (newest: step 3); pass --resume"), std::string::npos)
      << r.output;
  // What an interrupted save leaves behind goes at the next start.
  std::filesystem::create_directories(out + "/checkpoints/step-00000006.tmp-12345/model");
  std::filesystem::create_directories(out + "/checkpoints/step-00000003.old-777");
  r = test::run_hyla(tiny().args(out) + " --steps 2 --quiet --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(out + "/checkpoints")) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"step-00000002"});
  EXPECT_EQ(metrics(out).size(), 2u);
  EXPECT_NE(test::run_hyla(tiny().args(out) + " --resume --overwrite").exit_code, 0);  // one or the other
}

// --init takes a model's weights; its config must match but for the position limit, which no weight
// depends on (the long-context ladder raises it from the base model's).
TEST(Train, InitStartsFromAModelAndMayRaiseItsPositionLimitOnly) {
  const std::string from = (tiny().dir / "init-from").string();
  ASSERT_EQ(test::run_hyla(tiny().args(from) + " --steps 2 --quiet").exit_code, 0);
  nlohmann::json c = parse_json_file(tiny().config);
  c["max_position_embeddings"] = 2 * c["max_position_embeddings"].get<int64_t>();
  test::write_bytes(tiny().dir / "longer.json", c.dump());
  const std::string longer = "train --config " + (tiny().dir / "longer.json").string() + " --train " + tiny().train +
                             " --data " + tiny().data + " --steps 1 --quiet --init " + from + "/model --out ";
  auto r = test::run_hyla(longer + (tiny().dir / "init-longer").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("initialised from " + from + "/model"), std::string::npos) << r.output;
  c["hidden_size"] = 2 * c["hidden_size"].get<int64_t>();
  test::write_bytes(tiny().dir / "wider.json", c.dump());
  r = test::run_hyla("train --config " + (tiny().dir / "wider.json").string() + " --train " + tiny().train + " --data " +
                     tiny().data + " --steps 1 --quiet --init " + from + "/model --out " + (tiny().dir / "init-wider").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("its config.json differs from " + (tiny().dir / "wider.json").string() +
                          " (beyond max_position_embeddings)"),
            std::string::npos)
      << r.output;
}

TEST(Train, BadInputsAreClearErrors) {
  auto r = test::run_hyla("train --config " + tiny().config + " --train " + tiny().train + " --data /nonexistent --out " +
                          (tiny().dir / "x").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not a prepared data directory"), std::string::npos) << r.output;
  EXPECT_NE(test::run_hyla("report /nonexistent").exit_code, 0);
}

}  // namespace
}  // namespace hyla
