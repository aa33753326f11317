// Agentic RL's training side: group advantages, the GRPO update (it moves the log-probability of
// a rollout's own tokens in its advantage's direction, with the clipped and KL options too), the
// SFT demonstrations' masks, RL.json, and `hyla agent`, `hyla rl` and `hyla eval agent` end to end.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hyla/eval/agent_eval.h"
#include "hyla/rl/grpo.h"
#include "hyla/rl/rl_config.h"
#include "hyla/train/agent_mix.h"
#include "hyla/train/train_config.h"
#include "model_test_util.h"
#include "test_util.h"
#include "text_fixtures.h"
#include "tiny_run.h"

namespace hyla {
namespace {

using json = nlohmann::json;

TEST(Grpo, AdvantagesAreRewardsLessTheGroupMeanAndEqualGroupsAreDropped) {
  const GroupAdvantages g = group_advantages({1, 0, 0, 1, 0.1, 0.1, 0.1, 0.1}, 4, false);
  EXPECT_EQ(g.kept, (std::vector<bool>{true, false}));
  EXPECT_EQ(g.dropped, 1);
  EXPECT_EQ(g.advantages, (std::vector<double>{0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0}));
  const GroupAdvantages n = group_advantages({1, 0, 0, 1}, 4, true);
  EXPECT_NEAR(n.advantages[0], 1.0, 1e-5);  // over the group's std, 0.5
  EXPECT_NEAR(n.advantages[1], -1.0, 1e-5);
}

struct RlFixture {
  ModelConfig config = test::nano_config([](json& j) { j["vocab_size"] = 512; });
  const Tokenizer& tokenizer = test::small_tokenizer();
  std::unique_ptr<Environment> env = make_environment("calculator");
  AgentLimits limits;
  RlFixture() { limits.context = 4096; }
  // The updates' settings: f32, lr 1e-3, no gradient clipping (each test sets what it varies).
  static RlConfig update_config() {
    RlConfig rc;
    rc.precision = Precision::F32;
    rc.optimizer.lr = 1e-3;
    rc.optimizer.grad_clip = 0;
    return rc;
  }
  Trajectory demo(uint64_t index) {
    AgentSession s(*env, Split::Train, index, FaultConfig{0.0, {1, 1, 1, 1}}, limits, tokenizer);
    run_expert(s);
    return s.take();
  }
};

// An update raises the log-probability of a rollout's own tokens when its advantage is positive
// and lowers it when negative (from the same start): the sign and the masking of the
// policy-gradient weights are right, for the plain, reused-batch (clipped) and KL-penalty updates.
TEST(Grpo, AnUpdateMovesARolloutInItsAdvantagesDirection) {
  RlFixture f;
  const Trajectory a = f.demo(0), b = f.demo(1);
  for (const char* variant : {"plain", "reused batch (clipped)", "kl penalty", "sampled at temperature 0.7"}) {
    for (double advantage : {1.0, -1.0}) {
      Model model(f.config);
      test::randomize_params(model.params(), 9);
      RlConfig rc = RlFixture::update_config();
      std::unique_ptr<Model> reference;
      if (std::string(variant) == "reused batch (clipped)") rc.epochs = 2;
      if (std::string(variant) == "sampled at temperature 0.7") rc.temperature = 0.7;
      if (std::string(variant) == "kl penalty") {
        rc.kl_coef = 0.01;
        reference = std::make_unique<Model>(f.config);
        test::randomize_params(reference->params(), 10);
      }
      AdamW optimizer(model.params(), rc.optimizer);
      const double before = sampled_logprob(model, a, Precision::F32, rc.temperature);
      // A second rollout of the same group, advantage 0: it adds rows to the batch, never a gradient.
      const StepResult r = grpo_update(model, optimizer, rc, rc.optimizer.lr, {&a, &b}, {advantage, 0.0}, reference.get());
      EXPECT_FALSE(r.skipped) << variant;
      EXPECT_EQ(r.tokens, int64_t(a.ids.size() + b.ids.size() - 2) * rc.epochs) << variant;
      const double after = sampled_logprob(model, a, Precision::F32, rc.temperature);
      if (advantage > 0) {
        EXPECT_GT(after, before) << variant;
      } else {
        EXPECT_LT(after, before) << variant;
      }
    }
  }
}

// The update's loss is the policy that sampled: at temperature τ, the training forward's loss over
// a rollout's sampled rows equals −(1/T) Σ log softmax(logits / τ)[sampled id], the log-probability
// read off the logits (sampled_logprob), not the model's temperature-1 distribution.
TEST(Grpo, TheLossReadsThePolicyAtItsSamplingTemperature) {
  RlFixture f;
  const Trajectory a = f.demo(0);
  Model model(f.config);
  test::randomize_params(model.params(), 9);
  ModelInput in;
  const int64_t n = int64_t(a.ids.size()) - 1;
  in.tokens = TokenBatch::packed({n});
  in.ids.assign(a.ids.begin(), a.ids.end() - 1);
  int64_t scored = 0;
  for (int64_t r = 0; r < n; ++r) {
    const bool sampled = a.sampled[size_t(r) + 1] != 0;
    in.targets.push_back(sampled ? a.ids[size_t(r) + 1] : -1);
    scored += sampled;
  }
  ASSERT_GT(scored, 0);
  double at_one = 0;
  for (const double temperature : {1.0, 0.7}) {
    in.temperature = float(temperature);
    const double loss = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::None}).loss.loss;
    const double want = -sampled_logprob(model, a, Precision::F32, temperature) / double(scored);
    EXPECT_NEAR(loss, want, 1e-5 * std::abs(want)) << "temperature " << temperature;
    if (temperature == 1.0) at_one = loss;
    else EXPECT_GT(std::abs(loss - at_one), 1e-3) << "the temperature changes the loss";
  }
  in.temperature = 0.0f;
  EXPECT_THROW(model.forward(in, {.precision = Precision::F32, .outputs = Outputs::None}), Error);
}

// The loss is a mean over the batch's scored tokens: splitting the same rollouts into micro-batches
// of unequal sizes gives the same loss, gradient and update as one micro-batch (a per-micro-batch
// mean would weigh the shorter rollout's tokens more).
TEST(Grpo, TheLossIsAMeanOverTheBatchsTokensHoweverItIsSplit) {
  RlFixture f;
  const Trajectory a = f.demo(0);
  AgentLimits limits = f.limits;
  std::unique_ptr<Environment> ledger = make_environment("ledger");
  AgentSession s(*ledger, Split::Train, 3, FaultConfig{0.0, {1, 1, 1, 1}}, limits, f.tokenizer);
  run_expert(s);
  const Trajectory b = s.take();
  auto scored = [](const Trajectory& t) { return std::count(t.sampled.begin() + 1, t.sampled.end(), uint8_t(1)); };
  ASSERT_GT(std::abs(scored(a) - scored(b)), 10) << "the test needs rollouts of unequal scored lengths";

  struct Outcome {
    StepResult step;
    std::vector<float> values;
  };
  auto update = [&](int64_t micro_batch_tokens) {
    Model model(f.config);
    test::randomize_params(model.params(), 9);
    RlConfig rc = RlFixture::update_config();
    rc.micro_batch_tokens = micro_batch_tokens;
    AdamW optimizer(model.params(), rc.optimizer);
    Outcome o;
    o.step = grpo_update(model, optimizer, rc, rc.optimizer.lr, {&a, &b}, {0.7, -0.4}, nullptr);
    o.values.assign(model.params().values(), model.params().values() + model.params().numel());
    return o;
  };
  const Outcome whole = update(1 << 20);
  const Outcome split = update(int64_t(std::max(a.ids.size(), b.ids.size())));  // one rollout per micro-batch
  EXPECT_NEAR(split.step.loss, whole.step.loss, 1e-5 * std::abs(whole.step.loss));
  EXPECT_NEAR(split.step.grad_norm, whole.step.grad_norm, 1e-4 * whole.step.grad_norm);
  double max_diff = 0;
  for (size_t i = 0; i < whole.values.size(); ++i)
    max_diff = std::max(max_diff, double(std::abs(split.values[i] - whole.values[i])));
  // AdamW's first step moves each weight by about lr = 1e-3, whatever its gradient's size, so a
  // weight whose gradient is near zero moves by an amount its rounding decides (5.8e-5 seen with
  // AVX2's GEMMs); a reweighted batch flips some by ~2·lr.
  EXPECT_LT(max_diff, 1e-4);
}

// A demonstration's scored rows are exactly the assistant's: its replies and <|im_end|>.
TEST(AgentDemos, ScoreOnlyTheAssistantsTokensAndReplayFromTheirState) {
  RlFixture f;
  const Trajectory t = f.demo(3);
  ImageSequences seq;
  append_trajectory(t, seq);
  ASSERT_EQ(seq.rows(), int64_t(t.ids.size()) - 1);
  int64_t scored = 0;
  for (int64_t r = 0; r < seq.rows(); ++r) {
    EXPECT_EQ(seq.targets[size_t(r)] >= 0, t.sampled[size_t(r) + 1] != 0);
    scored += seq.targets[size_t(r)] >= 0;
  }
  EXPECT_EQ(scored, t.generated_tokens);

  AgentDemoSampler a({"calculator", "ledger"}, 0.2, f.tokenizer, 5), b({"calculator", "ledger"}, 0.2, f.tokenizer, 5);
  ImageSequences first, again;
  a.next(2000, first);
  EXPECT_GE(first.rows(), 2000);
  b.set_state(a.state());
  a.next(100, first);
  b.next(100, again);
  EXPECT_EQ(first.ids, again.ids);
  EXPECT_EQ(first.targets, again.targets);
}

TEST(AgentDemos, TrainJsonReadsTheAgentMixStrictly) {
  json j = {{"agent", {{"ratio", 2.0}, {"environments", {"calculator", "lookup"}}, {"fault_share", 0.3}}}};
  const TrainConfig c = TrainConfig::from_json(j, "t.json");
  EXPECT_EQ(c.agent_ratio, 2.0);
  EXPECT_EQ(c.agent_environments, (std::vector<std::string>{"calculator", "lookup"}));
  EXPECT_EQ(TrainConfig::from_json(c.to_json(), "t").to_json(), c.to_json());
  test::expect_error([] { TrainConfig::from_json(json{{"agent", {{"ratio", 1.0}, {"environments", {"chess"}}}}}, "t.json"); },
                     "agent.environments: unknown environment 'chess'");
  test::expect_error([] { TrainConfig::from_json(json{{"agent", {{"ratio", 1.0}}}}, "t.json"); },
                     "agent.environments must name at least one environment");
}

TEST(RlConfig, ReadsStrictlyAndNamesTheBrokenRule) {
  const json j = {{"group_size", 4},
                  {"curriculum", {{{"steps", 3}, {"environments", {"calculator"}}, {"max_steps", 4}, {"max_tokens", 64}},
                                  {{"steps", 2}, {"environments", {"calculator", "ledger"}}, {"max_steps", 8}, {"max_tokens", 256}}}},
                  {"limits", {{"context", 1024}}}};
  const RlConfig c = RlConfig::from_json(j, "rl.json");
  EXPECT_EQ(c.total_steps(), 5);
  EXPECT_EQ(c.stage_of(2), 0);
  EXPECT_EQ(c.stage_of(3), 1);
  EXPECT_EQ(c.limits_of(1).max_steps, 8);
  EXPECT_EQ(c.limits_of(1).context, 1024);
  EXPECT_EQ(RlConfig::from_json(c.to_json(), "x").to_json(), c.to_json());
  test::expect_error([] { RlConfig::from_json(json{{"group_size", 1}}, "rl.json"); }, "group_size (1) must be at least 2");
  test::expect_error([] { RlConfig::from_json(json{{"groupsize", 4}}, "rl.json"); }, "groupsize");
  test::expect_error([] { RlConfig::from_json(json{{"curriculum", {{{"steps", 1}, {"environments", {"go"}}}}}}, "rl.json"); },
                     "curriculum[0].environments: unknown environment 'go'");
  test::expect_error([] { RlConfig::from_json(json{{"limits", {{"max_steps", 0}}}}, "rl.json"); }, "max_steps");
}

// A model directory with the small tokenizer, for the commands.
struct TinyAgentModel {
  test::TempDir dir;
  std::string model;
  TinyAgentModel() {
    json c = parse_json_file((test::source_dir() / "configs/nano.json").string());
    c["vocab_size"] = 512;
    test::write_bytes(dir / "model.json", c.dump());
    test::small_tokenizer().save(dir / "tok.json");
    model = (dir / "model").string();
    EXPECT_EQ(test::run_hyla("init --config " + (dir / "model.json").string() + " --out " + model + " --seed 2 --tokenizer " +
                             (dir / "tok.json").string())
                  .exit_code,
              0);
  }
};

TEST(AgentCli, AgentPrintsAnEpisodeAndRefusesWhatItCannotRun) {
  TinyAgentModel m;
  const auto expert = test::run_hyla("agent --expert --tokenizer " + (m.dir / "tok.json").string() +
                                     " --env countdown --split shifted --task-seed 4 --json");
  ASSERT_EQ(expert.exit_code, 0) << expert.output;
  EXPECT_NE(expert.output.find("status answered | correct | reward 1.00"), std::string::npos) << expert.output;
  EXPECT_NE(expert.output.find("call check("), std::string::npos);
  const auto model = test::run_hyla("agent -m " + m.model + " --env calculator --max-tokens 24 --max-turn-tokens 8");
  ASSERT_EQ(model.exit_code, 0) << model.output;
  EXPECT_NE(model.output.find("status "), std::string::npos);
  const auto none = test::run_hyla("agent --env calculator");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.output.find("pass --model DIR, or --expert"), std::string::npos) << none.output;
  const auto unknown = test::run_hyla("agent --expert --tokenizer " + (m.dir / "tok.json").string() + " --env chess");
  EXPECT_NE(unknown.output.find("unknown environment 'chess'"), std::string::npos) << unknown.output;
}

// `hyla rl` runs its loop (rollouts, evaluation, checkpoints, report, model) and resumes; `hyla
// eval agent` measures the result beside the start.
TEST(AgentCli, RlRunsResumesAndEvalAgentComparesModels) {
  TinyAgentModel m;
  const json rl = {{"group_size", 2},
                   {"tasks_per_step", 2},
                   {"precision", "f32"},
                   {"curriculum", {{{"steps", 2}, {"environments", {"calculator"}}, {"max_steps", 2}, {"max_tokens", 16}},
                                   {{"steps", 1}, {"environments", {"ledger"}}, {"max_steps", 2}, {"max_tokens", 16}}}},
                   {"limits", {{"max_turn_tokens", 8}, {"context", 2048}}},
                   {"eval", {{"every", 2}, {"tasks", 1}}},
                   {"checkpoint", {{"every", 1}, {"keep", 2}}}};
  test::write_bytes(m.dir / "rl.json", rl.dump());
  const std::string run = (m.dir / "run").string();
  const std::string args = "rl --config " + (m.dir / "rl.json").string() + " -m " + m.model + " --out " + run;
  const auto r = test::run_hyla(args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dev pass@1"), std::string::npos) << r.output;
  const auto rows = test::metrics(run);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2]["stage"], 2);
  EXPECT_TRUE(rows[1].contains("dev_pass@1"));
  for (const json& row : rows) {
    EXPECT_GE(row["rollout_tok_s"].get<double>(), 0);
    EXPECT_GE(row["dropped_groups"].get<double>(), 0);
  }
  EXPECT_TRUE(std::filesystem::exists(run + "/model/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(run + "/report.html"));
  EXPECT_NE(test::run_hyla(args).output.find("--resume"), std::string::npos);  // never two runs in one directory

  const auto resumed = test::run_hyla(args + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos);
  EXPECT_EQ(test::metrics(run).size(), 3u);

  const std::string out = (m.dir / "eval.json").string(), report = (m.dir / "eval.html").string();
  const auto e = test::run_hyla("eval agent -m " + m.model + " -m " + run + "/model --label start --label rl --envs calculator,ledger "
                                "--tasks 2 --trials 4 --max-steps 2 --max-tokens 16 --max-turn-tokens 8 --out " + out +
                                " --report " + report);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const json results = parse_json_file(out);
  ASSERT_EQ(results["models"].size(), 2u);
  const json& s = results["models"][0]["summary"];
  EXPECT_EQ(s["calculator"]["episodes"], 8);
  EXPECT_EQ(s["all"]["tasks"], 4);
  EXPECT_TRUE(s["all"]["pass^k"].contains("4"));
  EXPECT_TRUE(s["all"]["pass@k"].contains("4"));
  EXPECT_NE(e.output.find("start"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(report));
}

TEST(AgentEval, PassEstimatorsAreTheUnbiasedOnes) {
  EXPECT_DOUBLE_EQ(pass_all_k(4, 4, 4), 1.0);
  EXPECT_DOUBLE_EQ(pass_all_k(4, 3, 4), 0.0);
  EXPECT_DOUBLE_EQ(pass_all_k(4, 2, 2), 1.0 / 6.0);
  EXPECT_DOUBLE_EQ(pass_any_k(4, 1, 1), 0.25);
  EXPECT_DOUBLE_EQ(pass_any_k(4, 1, 2), 0.5);
  EXPECT_DOUBLE_EQ(pass_any_k(16, 0, 16), 0.0);
  EXPECT_DOUBLE_EQ(pass_any_k(16, 1, 16), 1.0);
}

}  // namespace
}  // namespace hyla
