#include <fmt/format.h>

#include "commands.h"
#include "hyla/train/report.h"

namespace hyla::cli {

void add_report(CLI::App& app) {
  auto* cmd = app.add_subcommand("report", "Write RUN_DIR/report.html: loss, learning rate, throughput, expert load");
  static std::string run_dir;
  cmd->add_option("run_dir", run_dir, "Training run directory")->required();
  cmd->callback([] { fmt::print("wrote {}\n", write_report(run_dir).string()); });
}

}  // namespace hyla::cli
