// `hyla eval agent`: models side by side on a held-out split of the tool environments (docs/agent.md).
#include <fmt/format.h>

#include <filesystem>

#include "commands.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/eval/agent_eval.h"
#include "hyla/infer/engine.h"
#include "hyla/io/file.h"
#include "hyla/rl/agent_report.h"

namespace hyla::cli {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

void add_eval_agent(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("agent", "Agents end to end: pass@1, pass^k, pass@k, steps, tool calls, invalid "
                                           "calls, recovery per fault kind, guardrail counters");
  static std::vector<std::string> model_dirs, labels, environments = {"calculator", "lookup", "countdown", "ledger"};
  static std::string split = "test", dtype = "bf16", out_file, report_file;
  static int64_t tasks = 25, trials = 16, max_sequences = 32;
  static double temperature = 1.0, fault_share = 0.2;
  static uint64_t seed = 1;
  static bool print_json = false;
  static AgentLimits limits;
  cmd->add_option("-m,--model", model_dirs, "Model directory (repeatable: models side by side)")->required();
  cmd->add_option("--label", labels, "A name per --model for the tables (default: the directory)");
  cmd->add_option("--envs", environments, "Environments")->delimiter(',');
  cmd->add_option("--split", split, "test (held out), shifted (harder parameters), dev")
      ->check(CLI::IsMember({"train", "dev", "test", "shifted"}));
  cmd->add_option("--tasks", tasks, "Tasks per environment")->check(positive());
  cmd->add_option("--trials", trials, "Episodes per task (pass^k and pass@k for k up to this)")->check(positive());
  cmd->add_option("--temperature", temperature, "Sampling temperature of the trials")->check(non_negative());
  cmd->add_option("--seed", seed, "Sampling seed");
  cmd->add_option("--faults", fault_share, "Share of distinct tool calls that meet a fault")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--max-steps", limits.max_steps, "Assistant turns per episode")->check(positive());
  cmd->add_option("--max-tokens", limits.max_tokens, "Tokens generated per episode")->check(positive());
  cmd->add_option("--max-turn-tokens", limits.max_turn_tokens, "Tokens generated per turn")->check(positive());
  cmd->add_option("--context", limits.context, "Tokens of a whole conversation")->check(positive());
  cmd->add_option("--max-sequences", max_sequences, "Episodes played together")->check(positive());
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--out", out_file, "Write the JSON results here");
  cmd->add_option("--report", report_file, "Write a self-contained HTML report here");
  cmd->add_flag("--json", print_json, "Print the JSON results instead of the table");
  cmd->callback([cmd] {
    const bool context_given = cmd->count("--context") > 0;
    HYLA_CHECK(labels.empty() || labels.size() == model_dirs.size(), "--label: {} labels for {} models", labels.size(),
               model_dirs.size());
    ojson results = {{"split", split},        {"tasks", tasks},          {"trials", trials},
                     {"temperature", temperature}, {"fault_share", fault_share}, {"seed", seed},
                     {"environments", environments}, {"limits", limits.to_json()}, {"models", ojson::array()}};
    for (size_t i = 0; i < model_dirs.size(); ++i) {
      auto model = Model::load(model_dirs[i]);
      const Tokenizer tokenizer = load_model_tokenizer(model_dirs[i]);
      AgentEvalOptions o;
      o.environments = environments;
      o.split = parse_split(split);
      o.tasks = tasks;
      o.trials = trials;
      o.sampling.temperature = temperature;
      o.sampling.seed = seed;
      o.faults.share = fault_share;
      o.limits = limits;
      o.limits.context = fit_default_context(*model, limits.context, context_given, "eval agent");
      o.engine.max_sequences = max_sequences;
      o.engine.context = o.limits.context;
      o.engine.precision = dtype == "f32" ? Precision::F32 : Precision::BF16;
      const std::vector<Trajectory> episodes = play_agent_tasks(*model, tokenizer, o);
      const std::string label = labels.empty() ? fs::path(model_dirs[i]).lexically_normal().string() : labels[i];
      results["models"].push_back({{"label", label}, {"model", model_dirs[i]}, {"summary", summarize_agent_episodes(episodes)}});
    }
    if (!out_file.empty()) write_file_atomic(out_file, results.dump(2) + "\n");
    if (!report_file.empty()) write_file_atomic(report_file, agent_eval_html(results));
    if (print_json) {
      fmt::print("{}\n", results.dump(2));
      return;
    }
    fmt::print("split {}, {} tasks x {} trials per environment, temperature {}, faults {}\n", split, tasks, trials,
               temperature, fault_share);
    fmt::print("{:<24} {:<11} {:>22} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>8} {:>9} {:>9}\n", "model", "env",
               "pass@1 [95%]", "pass^2", "pass^4", "pass@4", "pass@N", "steps", "calls", "invalid", "recov.et", "retry.et");
    for (const auto& m : results["models"])
      for (const auto& [env, s] : m["summary"].items()) {
        auto at = [&](const char* table, int64_t k) {
          const std::string key = std::to_string(k);
          return s[table].contains(key) ? fmt::format("{:.3f}", s[table][key].get<double>()) : std::string("-");
        };
        const ojson& et = s["recovery"]["explicit_transient"];
        const ojson& retry = s["transient_retry"];
        fmt::print("{:<24} {:<11} {:>6.3f} [{:.3f}, {:.3f}] {:>7} {:>7} {:>7} {:>7} {:>6.2f} {:>6.2f} {:>8.3f} {:>9} {:>9}\n",
                   m["label"].get<std::string>(), env, s["pass@1"].get<double>(), s["pass@1_interval"][0].get<double>(),
                   s["pass@1_interval"][1].get<double>(), at("pass^k", 2), at("pass^k", 4), at("pass@k", 4),
                   at("pass@k", s["trials"].get<int64_t>()), s["mean_steps"].get<double>(), s["mean_tool_calls"].get<double>(),
                   s["invalid_call_rate"].get<double>(),
                   et["rate"].is_null() ? std::string("-") : fmt::format("{:.2f}", et["rate"].get<double>()),
                   retry["rate"].is_null() ? std::string("-") : fmt::format("{:.2f}", retry["rate"].get<double>()));
      }
  });
}

}  // namespace hyla::cli
