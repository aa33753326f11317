// `hyla agent`: one episode of a tool environment, played by a model (or the environment's expert)
// under the guardrails, printed turn by turn.
#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "commands.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/infer/engine.h"
#include "hyla/agent/agent.h"

namespace hyla::cli {

namespace {

void print_trajectory(const Trajectory& t) {
  for (const ChatMessage& m : t.messages) {
    if (m.role == "system") continue;
    std::string text = m.content;
    for (const ToolCall& c : m.tool_calls) text += fmt::format("{}call {}({})", text.empty() ? "" : " ", c.name, c.arguments);
    fmt::print("{:>10}  {}\n", m.role, text);
  }
  std::vector<std::string> faults;
  for (size_t k = 0; k < kFaultKinds.size(); ++k)
    if (t.faults[k] > 0) faults.push_back(fmt::format("{} {}", t.faults[k], to_string(kFaultKinds[k])));
  fmt::print("status {} | {} | reward {:.2f} | {} steps, {} tool calls ({} invalid, {} failed) | faults: {} | {} tokens "
             "generated, {} of {} prompt tokens from cache | confidence {:.3f} | {:.2f} s\n",
             to_string(t.status), t.correct() ? "correct" : "not correct", t.reward, t.steps, t.tool_calls,
             t.invalid_calls, t.failed_calls, faults.empty() ? "none" : fmt::format("{}", fmt::join(faults, ", ")),
             t.generated_tokens, t.cached_prompt_tokens, t.prompt_tokens, t.confidence, t.seconds);
}

}  // namespace

void add_agent(CLI::App& app) {
  auto* cmd = app.add_subcommand("agent", "Play one episode of a tool environment and print the trajectory");
  static std::string model_dir, tokenizer_file, env_name, split = "test", dtype = "bf16";
  static uint64_t task = 0;
  static double fault_share = 0.2;
  static bool expert = false, print_json = false;
  static AgentLimits limits;
  static SamplingParams sampling = [] {
    SamplingParams s;
    s.temperature = 0;
    return s;
  }();
  static std::optional<double> min_confidence;
  cmd->add_option("-m,--model", model_dir, "Model directory");
  cmd->add_option("--tokenizer", tokenizer_file, "tokenizer.json (with --expert and no --model)")->check(CLI::ExistingFile);
  cmd->add_flag("--expert", expert, "Let the environment's expert play (a demonstration) instead of a model");
  cmd->add_option("--env", env_name, "Environment: calculator, lookup, countdown, ledger")->required();
  cmd->add_option("--task-seed", task, "The task's index in its split");
  cmd->add_option("--split", split, "train, dev, test or shifted")->check(CLI::IsMember({"train", "dev", "test", "shifted"}));
  cmd->add_option("--faults", fault_share, "Share of distinct tool calls that meet a fault")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-steps", limits.max_steps, "Assistant turns")->check(positive());
  cmd->add_option("--max-tokens", limits.max_tokens, "Tokens generated over the episode")->check(positive());
  cmd->add_option("--max-turn-tokens", limits.max_turn_tokens, "Tokens generated per turn")->check(positive());
  cmd->add_option("--max-seconds", limits.max_seconds, "Wall-clock budget")->check(positive());
  cmd->add_option("--context", limits.context, "Tokens of the whole conversation")->check(positive());
  cmd->add_option("--max-failures", limits.max_consecutive_failures, "Tool calls in a row that may fail before the fallback")
      ->check(positive());
  cmd->add_option("--min-confidence", min_confidence,
                  "Abstain when the final reply's mean token log-probability is below this");
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  add_sampling_options(cmd, sampling);
  cmd->add_flag("--json", print_json, "Print the episode's summary as JSON after the trajectory");
  cmd->callback([cmd] {
    HYLA_CHECK(expert || !model_dir.empty(), "hyla agent: pass --model DIR, or --expert to watch the expert play");
    HYLA_CHECK(!model_dir.empty() || !tokenizer_file.empty(), "hyla agent --expert: pass --tokenizer FILE (or --model DIR)");
    if (min_confidence) limits.min_confidence = *min_confidence;
    const auto env = make_environment(env_name);
    FaultConfig faults;
    faults.share = fault_share;
    const std::filesystem::path dir(model_dir);
    const Tokenizer tokenizer = tokenizer_file.empty() ? load_model_tokenizer(dir) : Tokenizer::load(tokenizer_file);
    std::unique_ptr<Model> model;
    if (!expert) {
      model = load_model_for_engine(dir);
      limits.context = fit_default_context(*model, limits.context, cmd->count("--context") > 0, "agent");
    }
    std::vector<AgentSession> sessions;
    sessions.emplace_back(*env, parse_split(split), task, faults, limits, tokenizer);
    if (expert) {
      run_expert(sessions[0]);
    } else {
      EngineOptions options;
      options.max_sequences = 1;
      options.context = limits.context;
      options.precision = dtype == "f32" ? Precision::F32 : Precision::BF16;
      Scheduler scheduler(*model, tokenizer, options);
      run_agents(scheduler, sessions, sampling);
    }
    const Trajectory t = sessions[0].take();
    print_trajectory(t);
    if (print_json) fmt::print("{}\n", t.summary().dump());
  });
}

}  // namespace hyla::cli
