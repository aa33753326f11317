// Agentic RL's pieces below the trainer: arithmetic, tool-call checks, fault injection, the four
// environments (each task solved by its expert, faults recovered from), and the agent runtime's
// guardrails and token bookkeeping, with scripted policies and with a model through the Scheduler.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "hyla/data/chat_template.h"
#include "hyla/agent/agent.h"
#include "hyla/agent/arithmetic.h"
#include "hyla/agent/environment.h"
#include "hyla/agent/faults.h"
#include "hyla/agent/tools.h"
#include "model_test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using json = nlohmann::json;

TEST(Arithmetic, EvaluatesWithPrecedenceAndRefusesWhatIsNotExact) {
  EXPECT_EQ(evaluate_arithmetic("2 + 3 * 4").value, 14);
  EXPECT_EQ(evaluate_arithmetic("(2 + 3) * 4").value, 20);
  EXPECT_EQ(evaluate_arithmetic("((12 + 7) * 3) - 5").value, 52);
  EXPECT_EQ(evaluate_arithmetic("-4 - -6").value, 2);
  EXPECT_EQ(evaluate_arithmetic("84 / 7 / 2").value, 6);
  EXPECT_EQ(evaluate_arithmetic("(3 + 4) * 25 - 1").literals, (std::vector<int64_t>{3, 4, 25, 1}));
  EXPECT_NE(evaluate_arithmetic("7 / 2").error.find("not a whole number"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("1 / 0").error.find("division by zero"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("2 + x").error.find("unexpected 'x' at character 5"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("(1 + 2").error.find("missing ')'"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("").error.find("ends where a number"), std::string::npos);
  EXPECT_NE(evaluate_arithmetic("999999999 * 999999999").error.find("10^15"), std::string::npos);
  EXPECT_FALSE(evaluate_arithmetic(std::string(10000, '(')).ok);  // nesting is bounded, never a crash
}

TEST(ToolCalls, AreCheckedAgainstTheirSchemaBeforeTheyRun) {
  const auto env = make_environment("ledger");
  const auto tools = env->tools();
  auto error = [&](const std::string& name, const std::string& args) { return check_call(tools, {name, args}).error; };
  EXPECT_EQ(error("transfer", R"({"from": "alice", "to": "bob", "amount": 5})"), "");
  EXPECT_NE(check_call(tools, {"transfer", R"({"from": "alice", "to": "bob", "amount": 5})"}).tool, nullptr);
  EXPECT_NE(error("wire", "{}").find("no tool named \"wire\" (the tools are balance, transfer)"), std::string::npos);
  EXPECT_EQ(error("transfer", "{\"from\": "), "the arguments are not valid JSON");
  EXPECT_EQ(error("transfer", R"({"from": "alice", "to": "bob"})"), "arguments: missing the required field \"amount\"");
  EXPECT_EQ(error("transfer", R"({"from": "alice", "to": "bob", "amount": "5"})"),
            "arguments.amount: expected an integer, got a string");
  EXPECT_EQ(error("transfer", R"({"from": "alice", "to": "bob", "amount": 0})"), "arguments.amount: 0 is below the minimum 1");
  EXPECT_NE(error("transfer", R"({"from": "zed", "to": "bob", "amount": 5})").find("arguments.from: \"zed\" is not one of"),
            std::string::npos);
  EXPECT_EQ(error("transfer", R"({"from": "alice", "to": "bob", "amount": 5, "fee": 1})"),
            "arguments: no field \"fee\" is defined");
  EXPECT_EQ(error("balance", "[1]"), "arguments: expected an object, got an array");
}

TEST(Faults, HitTheirShareOfCallsAndTransientOnesClearOnRetry) {
  FaultInjector none({0.0, {1, 1, 1, 1}}, 7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(none.next("calc " + std::to_string(i)), FaultKind::None);

  FaultInjector transient({1.0, {1, 0, 0, 0}}, 7), permanent({1.0, {0, 1, 0, 0}}, 7);
  EXPECT_EQ(transient.next("k"), FaultKind::ExplicitTransient);
  EXPECT_EQ(transient.next("k"), FaultKind::None);
  EXPECT_EQ(transient.next("other"), FaultKind::ExplicitTransient);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(permanent.next("k"), FaultKind::ExplicitPermanent);

  FaultInjector a({0.2, {1, 1, 1, 1}}, 11), b({0.2, {1, 1, 1, 1}}, 11);
  std::array<int, 5> kinds{};
  for (int i = 0; i < 4000; ++i) {
    const FaultKind k = a.next("call " + std::to_string(i));
    EXPECT_EQ(k, b.next("call " + std::to_string(i)));  // a pure function of seed and call
    ++kinds[size_t(k)];
  }
  EXPECT_NEAR(kinds[0] / 4000.0, 0.8, 0.03);
  for (int k = 1; k < 5; ++k) EXPECT_NEAR(kinds[size_t(k)] / 4000.0, 0.05, 0.015) << k;
  EXPECT_THROW(FaultInjector({1.5, {1, 1, 1, 1}}, 1), Error);
}

TEST(Environments, TasksAreSeededPerSplitAndUnknownNamesAreRefused) {
  for (const std::string& name : environment_names()) {
    const auto env = make_environment(name);
    EXPECT_EQ(env->make(Split::Train, 3)->task(), env->make(Split::Train, 3)->task()) << name;
    std::set<std::string> tasks;
    for (Split s : {Split::Train, Split::Dev, Split::Test}) tasks.insert(env->make(s, 3)->task());
    EXPECT_EQ(tasks.size(), 3u) << name;
  }
  EXPECT_EQ(parse_split("dev"), Split::Dev);
  EXPECT_THROW(parse_split("valid"), Error);
  try {
    make_environment("chess");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calculator, lookup, countdown, ledger"), std::string::npos);
  }
  EXPECT_EQ(extract_answer("I think.\nAnswer:  42 \nthanks"), "42");
  EXPECT_EQ(extract_answer("no answer"), std::nullopt);
}

TEST(Environments, AWrongAnswerIsJudgedWrong) {
  const auto calc = make_environment("calculator")->make(Split::Test, 0);
  EXPECT_EQ(calc->judge("not a number").well_formed, false);
  const auto lookup = make_environment("lookup")->make(Split::Test, 0);
  EXPECT_FALSE(lookup->judge("1234567").correct && lookup->judge("7654321").correct);
  const auto countdown = make_environment("countdown")->make(Split::Test, 0);
  EXPECT_FALSE(countdown->judge("1 + 1 + 1 + 1 + 1").correct);  // numbers used more often than given
  const auto ledger = make_environment("ledger")->make(Split::Test, 0);
  EXPECT_FALSE(ledger->judge("done").correct);  // nothing was paid
}

struct Fixture {
  const Tokenizer& tokenizer = test::small_tokenizer();
  AgentLimits limits;
  Fixture() {
    limits.context = 4096;
    limits.max_steps = 24;
    limits.max_tokens = 4096;
    limits.max_consecutive_failures = 4;
  }
};

// The expert solves every task of every split without faults, and with explicit faults it retries
// and works around them; its trajectory's ids are exactly its messages encoded in hyla's chat format.
TEST(AgentRuntime, TheExpertSolvesEveryTaskAndRecoversFromExplicitFaults) {
  Fixture f;
  int64_t transient_faults = 0;
  for (const std::string& name : environment_names()) {
    const auto env = make_environment(name);
    const ChatTemplate chat(f.tokenizer, ChatFormat::Hyla);
    const ChatOptions options = chat_options(*env);
    for (Split split : {Split::Train, Split::Shifted}) {
      for (uint64_t i = 0; i < 20; ++i) {
        AgentSession clean(*env, split, i, {0.0, {1, 1, 1, 1}}, f.limits, f.tokenizer);
        run_expert(clean);
        const Trajectory& t = clean.trajectory();
        ASSERT_TRUE(t.correct()) << name << " " << i << ": " << chat.apply(t.messages, false, options);
        EXPECT_EQ(t.reward, 1.0);
        EXPECT_EQ(t.ids, chat.encode(t.messages, false, options));
        EXPECT_EQ(t.invalid_calls, 0);
        if (name == "calculator") {
          EXPECT_EQ(t.tool_calls, 1) << "the whole expression in one call";
        }
        ChatOptions full = options;
        full.compact_tools = false;  // the JSON definitions hyla serve lists
        if (i == 0) {
          EXPECT_LT(t.ids.size() + 50, chat.encode(t.messages, false, full).size()) << name;
        }

        AgentSession faulty(*env, split, i, {0.3, {1, 1, 0, 0}}, f.limits, f.tokenizer);
        run_expert(faulty);
        EXPECT_TRUE(faulty.trajectory().correct()) << name << " " << i << " " << to_string(faulty.trajectory().status) << ": " << chat.apply(faulty.trajectory().messages, false, options).substr(1000);
        EXPECT_EQ(faulty.trajectory().ids, chat.encode(faulty.trajectory().messages, false, options));
        EXPECT_EQ(faulty.trajectory().transient_retried, faulty.trajectory().faults[0]) << "the expert retries each";
        transient_faults += faulty.trajectory().faults[0];
      }
    }
  }
  EXPECT_GT(transient_faults, 20);
}

// Silent faults are injected where the expert cannot see them: some episodes end wrong.
TEST(AgentRuntime, SilentFaultsCostTheExpertSomeEpisodes) {
  Fixture f;
  const auto env = make_environment("calculator");
  int wrong = 0, hit = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    AgentSession s(*env, Split::Dev, i, {0.5, {0, 0, 1, 1}}, f.limits, f.tokenizer);
    run_expert(s);
    const Trajectory& t = s.trajectory();
    hit += t.faults[2] + t.faults[3] > 0;
    wrong += !t.correct();
  }
  EXPECT_GT(hit, 10);
  EXPECT_GT(wrong, 5);
  EXPECT_LE(wrong, hit);
}

// In lookup the expert checks what it reads: a line without the key it asked for is a silent
// fault's, and it searches again in another form. It never answers a value a silent fault gave it
// (it answers "not found" when every attempt met one), and recovers most episodes that met one.
TEST(AgentRuntime, TheLookupExpertCatchesSilentFaultsByCheckingWhatItReads) {
  Fixture f;
  const auto env = make_environment("lookup");
  int hit = 0, recovered = 0;
  for (uint64_t i = 0; i < 60; ++i) {
    AgentSession s(*env, Split::Dev, i, {0.3, {0, 0, 1, 1}}, f.limits, f.tokenizer);
    run_expert(s);
    const Trajectory& t = s.trajectory();
    const bool met = t.faults[2] + t.faults[3] > 0;
    hit += met;
    recovered += met && t.correct();
    if (!t.correct()) {
      EXPECT_EQ(t.messages.back().content, "Answer: not found") << i << ": " << ChatTemplate(f.tokenizer).apply(t.messages);
      EXPECT_TRUE(met) << i;
    }
  }
  EXPECT_GT(hit, 15);
  EXPECT_GT(recovered, hit * 2 / 3) << recovered << " of " << hit;
}

// The rows the policy wrote are marked, and only those: each assistant turn's content and its
// <|im_end|>, never the turn header, the tool observations or the prompt.
TEST(AgentRuntime, OnlyThePolicysRowsAreMarkedSampled) {
  Fixture f;
  const auto env = make_environment("lookup");
  AgentSession s(*env, Split::Test, 5, {0.0, {1, 1, 1, 1}}, f.limits, f.tokenizer);
  run_expert(s);
  const Trajectory& t = s.trajectory();
  std::vector<int32_t> sampled;
  for (size_t i = 0; i < t.ids.size(); ++i)
    if (t.sampled[i]) sampled.push_back(t.ids[i]);
  std::vector<int32_t> expected;
  for (const ChatMessage& m : t.messages)
    if (m.role == "assistant") {
      const auto ids = encode_assistant_reply(f.tokenizer, m);
      expected.insert(expected.end(), ids.begin(), ids.end());
    }
  EXPECT_EQ(sampled, expected);
  EXPECT_EQ(t.steps, 3);  // search, read, answer
  EXPECT_EQ(t.generated_tokens, int64_t(expected.size()));
}

// A scripted policy: replies given as text, one per turn.
void play(AgentSession& s, const Tokenizer& tokenizer, const std::vector<std::string>& replies, double logprob = -0.1) {
  for (const std::string& text : replies) {
    if (s.done()) return;
    std::vector<int32_t> ids = tokenizer.encode(text, true);
    ids.push_back(tokenizer.special_id("<|im_end|>"));
    s.reply(ids, std::vector<double>(ids.size(), logprob));
  }
}

TEST(Faults, ARetryIsTheSameCallMadeAgainAfterATransientError) {
  Fixture f;
  const auto env = make_environment("calculator");
  AgentSession s(*env, Split::Test, 1, {1.0, {1, 0, 0, 0}}, f.limits, f.tokenizer);
  auto call = [](const std::string& expression) {
    return "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": \"" + expression + "\"}}\n</tool_call>";
  };
  play(s, f.tokenizer, {call("2+3"), call("2 + 3"), call("2+3"), call("2+3"), "Answer: 5"});
  const Trajectory& t = s.trajectory();
  EXPECT_EQ(t.faults[0], 2) << "each distinct call meets its transient fault once";
  EXPECT_EQ(t.transient_retried, 1) << "only \"2+3\" was made again; a reworded call is not a retry";
  EXPECT_EQ(t.failed_calls, 2);
}

TEST(Guardrails, InvalidCallsAreObservationsAndRepeatedFailuresEndTheEpisode) {
  Fixture f;
  const auto env = make_environment("calculator");
  AgentLimits limits = f.limits;
  limits.max_consecutive_failures = 3;
  AgentSession s(*env, Split::Test, 1, {0.0, {1, 1, 1, 1}}, limits, f.tokenizer);
  play(s, f.tokenizer,
       {"<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"1 + 1\"}}\n</tool_call>",
        "<tool_call>\nnot json\n</tool_call>", "<tool_call>\n{\"name\": \"sqrt\", \"arguments\": {}}\n</tool_call>",
        "Answer: 3"});
  const Trajectory& t = s.trajectory();
  EXPECT_EQ(t.status, EpisodeStatus::GaveUp);
  EXPECT_EQ(t.invalid_calls, 3);
  EXPECT_EQ(t.tool_calls, 3);
  EXPECT_EQ(t.steps, 3);
  EXPECT_EQ(t.reward, 0.0);
  ASSERT_EQ(t.messages.back().role, "tool");
  EXPECT_NE(t.messages.back().content.find("no tool named"), std::string::npos);
  EXPECT_NE(t.messages[t.messages.size() - 3].content.find("a <tool_call> block must hold"), std::string::npos);
  EXPECT_NE(t.messages[t.messages.size() - 5].content.find("missing the required field \\\"expression\\\""), std::string::npos);
}

TEST(Guardrails, BudgetsEndEpisodesWithTheirStatusAndNoReward) {
  Fixture f;
  const auto env = make_environment("calculator");
  const std::string call = "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": \"1 + 1\"}}\n</tool_call>";
  AgentLimits steps = f.limits;
  steps.max_steps = 2;
  AgentSession a(*env, Split::Test, 1, {0.0, {1, 1, 1, 1}}, steps, f.tokenizer);
  play(a, f.tokenizer, {call, call, call});
  EXPECT_EQ(a.trajectory().status, EpisodeStatus::StepBudget);
  EXPECT_EQ(a.trajectory().steps, 2);

  AgentLimits tokens = f.limits;
  tokens.max_tokens = 30;
  AgentSession b(*env, Split::Test, 1, {0.0, {1, 1, 1, 1}}, tokens, f.tokenizer);
  EXPECT_LE(b.reply_limit(), 30);
  play(b, f.tokenizer, {call, call, call});
  EXPECT_EQ(b.trajectory().status, EpisodeStatus::TokenBudget);

  AgentLimits time = f.limits;
  time.max_seconds = 1e-9;  // spent before the first reply arrives
  AgentSession d(*env, Split::Test, 1, {0.0, {1, 1, 1, 1}}, time, f.tokenizer);
  play(d, f.tokenizer, {"Answer: 1"});
  EXPECT_EQ(d.trajectory().status, EpisodeStatus::TimeBudget);
  EXPECT_EQ(d.trajectory().reward, 0.0);

  AgentLimits context = f.limits;
  context.context = 40;  // the system turn alone is longer
  AgentSession c(*env, Split::Test, 1, {0.0, {1, 1, 1, 1}}, context, f.tokenizer);
  EXPECT_TRUE(c.done());
  EXPECT_EQ(c.trajectory().status, EpisodeStatus::ContextFull);
}

TEST(Guardrails, AnUnsureFinalAnswerAbstains) {
  Fixture f;
  const auto env = make_environment("calculator");
  const auto episode = env->make(Split::Test, 2);
  const std::string task = episode->task();
  const std::string right = "Answer: " + std::to_string(evaluate_arithmetic(task.substr(8, task.size() - 9)).value);
  AgentLimits sure = f.limits;
  sure.min_confidence = -1.0;
  AgentSession confident(*env, Split::Test, 2, {0.0, {1, 1, 1, 1}}, sure, f.tokenizer);
  play(confident, f.tokenizer, {right}, -0.5);
  EXPECT_EQ(confident.trajectory().status, EpisodeStatus::Answered);
  EXPECT_EQ(confident.trajectory().reward, 1.0);
  AgentSession unsure(*env, Split::Test, 2, {0.0, {1, 1, 1, 1}}, sure, f.tokenizer);
  play(unsure, f.tokenizer, {right}, -2.0);
  EXPECT_EQ(unsure.trajectory().status, EpisodeStatus::Abstained);
  EXPECT_EQ(unsure.trajectory().reward, 0.0);
  AgentSession wrong(*env, Split::Test, 2, {0.0, {1, 1, 1, 1}}, f.limits, f.tokenizer);
  play(wrong, f.tokenizer, {"Answer: -99999"});
  EXPECT_DOUBLE_EQ(wrong.trajectory().reward, f.limits.format_reward);
  AgentSession unformed(*env, Split::Test, 2, {0.0, {1, 1, 1, 1}}, f.limits, f.tokenizer);
  play(unformed, f.tokenizer, {"I do not know"});
  EXPECT_EQ(unformed.trajectory().reward, 0.0);
}

TEST(Guardrails, LimitsReadStrictlyFromJson) {
  const AgentLimits l = AgentLimits::from_json(json{{"max_steps", 4}, {"min_confidence", -1.5}}, "rl.json");
  EXPECT_EQ(l.max_steps, 4);
  EXPECT_EQ(l.min_confidence, -1.5);
  EXPECT_EQ(AgentLimits::from_json(l.to_json(), "x").to_json(), l.to_json());
  EXPECT_THROW(AgentLimits::from_json(json{{"max_step", 4}}, "rl.json"), Error);
  EXPECT_THROW(AgentLimits::from_json(json{{"max_steps", 0}}, "rl.json"), Error);
}

// A model drives sessions through the scheduler: every turn's prompt is the trajectory so far,
// whose prompt state the prefix cache restores (a later turn reads only what the last one added),
// and the ids the model sampled are the ones kept.
TEST(AgentRuntime, AModelPlaysEpisodesThroughTheSchedulerReusingEachTrajectorysState) {
  const ModelConfig config = test::nano_config([](json& j) { j["vocab_size"] = 512; });
  Model model(config);
  test::randomize_params(model.params(), 5);
  const Tokenizer& tokenizer = test::small_tokenizer();
  EngineOptions options;
  options.max_sequences = 4;
  options.context = 1024;
  options.precision = Precision::F32;
  options.latent_dtype = DType::F32;
  options.snapshot_interval = 64;
  Scheduler scheduler(model, tokenizer, options);
  AgentLimits limits;
  limits.context = 1024;
  limits.max_turn_tokens = 12;
  limits.max_tokens = 60;
  const auto env = make_environment("calculator");
  std::vector<AgentSession> sessions;
  for (uint64_t i = 0; i < 6; ++i) sessions.emplace_back(*env, Split::Dev, i % 3, FaultConfig{}, limits, tokenizer);
  std::vector<size_t> opening;
  for (const AgentSession& s : sessions) opening.push_back(s.ids().size());
  SamplingParams sampling;
  sampling.temperature = 1.0;
  sampling.seed = 3;
  run_agents(scheduler, sessions, sampling);
  for (AgentSession& s : sessions) {
    ASSERT_TRUE(s.done());
    const Trajectory& t = s.trajectory();
    EXPECT_LE(t.generated_tokens, limits.max_tokens);
    EXPECT_GE(t.steps, 1);
    EXPECT_EQ(t.ids.size(), t.sampled.size());
    EXPECT_EQ(t.ids.size(), t.logprobs.size());
    for (size_t i = 0; i < t.ids.size(); ++i)
      if (t.sampled[i]) {
        EXPECT_LE(t.logprobs[i], 0.0f);
      }
    if (t.steps > 1) {
      EXPECT_GT(t.cached_prompt_tokens, 0);
    }
  }
  // Sessions 3-5 are the tasks of sessions 0-2 (other sampling seeds): they start once those have
  // read the prompt, and restore all of it but its last token.
  for (size_t j = 3; j < 6; ++j) EXPECT_GE(sessions[j].trajectory().cached_prompt_tokens, int64_t(opening[j]) - 1) << j;
  EXPECT_NE(sessions[0].trajectory().ids, sessions[3].trajectory().ids);
}

}  // namespace
}  // namespace hyla
