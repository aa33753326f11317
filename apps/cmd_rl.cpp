#include "commands.h"
#include "hyla/rl/grpo.h"

namespace hyla::cli {

void add_rl(CLI::App& app) {
  auto* cmd = app.add_subcommand("rl", "Agentic RL: group rollouts in the tool environments, full-trajectory GRPO "
                                       "(docs/agent.md)");
  static RlOptions o;
  cmd->add_option("--config", o.config, "RL.json (configs/rl-agent.json)")->required()->check(CLI::ExistingFile);
  cmd->add_option("-m,--model", o.model_dir, "The starting model directory (e.g. the SFT model)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--out", o.run_dir, "Run directory (metrics.jsonl, report.html, checkpoints, model/)")->required();
  auto* resume = cmd->add_flag("--resume", o.resume, "Continue from the run directory's newest checkpoint");
  cmd->add_flag("--overwrite", o.overwrite, "Start over in a run directory that holds checkpoints (deleting them)")
      ->excludes(resume);
  cmd->add_flag("--quiet", o.quiet, "Print only the steps that evaluate");
  cmd->callback([] { run_rl(o); });
}

}  // namespace hyla::cli
