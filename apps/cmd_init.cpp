#include <fmt/format.h>

#include "commands.h"
#include "hyla/io/file.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"

namespace hyla::cli {

void add_init(CLI::App& app) {
  auto* cmd = app.add_subcommand("init", "Write a freshly initialised model directory (SPEC §9)");
  static std::string config_path, out, weight_dtype = "f32", tokenizer;
  static uint64_t seed = 0;
  static bool force = false;
  cmd->add_option("--config", config_path, "Model config.json")->required();
  cmd->add_option("--out", out, "Output model directory (replaced: only a model directory, unless --force)")->required();
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->add_option("--seed", seed, "Initialisation seed");
  cmd->add_option("--weight-dtype", weight_dtype, "Weight dtype in the file")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  refuse_renamed(cmd, "--dtype", "--weight-dtype", kDtypeMeansMatmulInputs);
  cmd->add_option("--tokenizer", tokenizer, "tokenizer.json to place in the model directory")->check(CLI::ExistingFile);
  cmd->callback([] {
    std::vector<std::filesystem::path> read = {config_path};
    if (!tokenizer.empty()) read.emplace_back(tokenizer);
    check_replaceable_output(out, "config.json", read, force);
    const ModelConfig config = ModelConfig::load(config_path);
    Model model(config);
    model.initialize(seed);
    const DType t = weight_dtype == "bf16" ? DType::BF16 : weight_dtype == "f16" ? DType::F16 : DType::F32;
    model.save(out, t, tokenizer);
    const ParamCounts counts = count_parameters(config);
    fmt::print("wrote {} ({} parameters, {} active per token, seed {}, {})\n", out, counts.total_sum(),
               counts.active_sum(), seed, weight_dtype);
  });
}

}  // namespace hyla::cli
