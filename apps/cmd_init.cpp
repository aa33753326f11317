#include <fmt/format.h>

#include "commands.h"
#include "hyla/data/gguf_vocab.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/io/file.h"
#include "hyla/model/model_files.h"
#include "hyla/model/initialized_weights.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"

namespace hyla::cli {

void add_init(CLI::App& app) {
  auto* cmd = app.add_subcommand("init", "Write a freshly initialised model directory (SPEC §9), or a llama.cpp GGUF "
                                         "of one, written a tensor at a time whatever the model's size");
  static std::string config_path, out, weight_dtype = "f32", tokenizer, type = "bf16", experts = "float";
  static uint64_t seed = 0;
  static bool force = false;
  cmd->add_option("--config", config_path, "Model config.json")->required();
  cmd->add_option("--out", out, "Output model directory (replaced: only a model directory, unless --force), or a "
                                "FILE.gguf")->required();
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->add_option("--seed", seed, "Initialisation seed");
  cmd->add_option("--weight-dtype", weight_dtype, "Weight dtype in the file")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  refuse_renamed(cmd, "--dtype", "--weight-dtype", kDtypeMeansMatmulInputs);
  cmd->add_option("--tokenizer", tokenizer, "tokenizer.json, or a model (directory, Kimi checkpoint, GGUF) whose "
                                            "tokenizer to place in the model directory (or the GGUF's vocabulary)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--type", type, "FILE.gguf: matrix type f32, f16, bf16 or q8_0 (norms, biases, convs, router: f32)")
      ->capture_default_str();
  cmd->add_option("--experts", experts, "Routed experts as the other matrices (float) or MXFP4 (the rounding of "
                                        "hyla quantize --experts mxfp4)")
      ->check(CLI::IsMember({"float", "mxfp4"}))
      ->capture_default_str();
  cmd->callback([cmd] {
    if (out.ends_with(".gguf")) {
      HYLA_CHECK(force || !std::filesystem::exists(out) || is_gguf_file(out),
                 "init: {} exists and is not a GGUF file; give --force to replace it", out);
      HYLA_CHECK(cmd->count("--weight-dtype") == 0, "init: --weight-dtype is for a model directory; a GGUF takes --type");
      const ModelConfig config = model_config_of(config_path);
      GgufExportOptions options{.matrices = ggml_type_from_name(type), .name = "hyla init"};
      if (!tokenizer.empty()) add_gguf_tokenizer(load_tokenizer_argument(tokenizer), config.vocab_size, options.tokenizer);
      const std::string arch = save_gguf(out, config, *initialized_weights(config, seed, experts == "mxfp4"), options).arch;
      const ParamCounts counts = count_parameters(config);
      fmt::print("wrote {}: llama.cpp {} GGUF, {} bytes ({} parameters, {} active per token, seed {}, matrices {}, "
                 "experts {})\n", out, arch, std::filesystem::file_size(out), counts.total_sum(), counts.active_sum(),
                 seed, type, experts == "mxfp4" ? "mxfp4" : type);
      return;
    }
    HYLA_CHECK(cmd->count("--type") == 0, "init: --type is for a FILE.gguf --out; a model directory takes --weight-dtype");
    std::vector<std::filesystem::path> read = {config_path};
    if (!tokenizer.empty()) read.emplace_back(tokenizer);
    check_replaceable_output(out, "config.json", read, force);
    const ModelConfig config = model_config_of(config_path);
    const DType t = weight_dtype == "bf16" ? DType::BF16 : weight_dtype == "f16" ? DType::F16 : DType::F32;
    // A tokenizer.json is copied as it is; another model's tokenizer travels as the one it reads as.
    std::string tokenizer_json;
    if (!tokenizer.empty())
      tokenizer_json = std::filesystem::is_regular_file(tokenizer) && !is_gguf_file(tokenizer)
                           ? read_file(tokenizer)
                           : load_tokenizer_argument(tokenizer).to_json().dump(2) + "\n";
    // A tensor at a time, in shards of 4 GB: a model of any size.
    save_model_directory(out, config, *initialized_weights(config, seed, experts == "mxfp4"), t, tokenizer_json);
    const ParamCounts counts = count_parameters(config);
    fmt::print("wrote {} ({} parameters, {} active per token, seed {}, {}, experts {})\n", out, counts.total_sum(),
               counts.active_sum(), seed, weight_dtype, experts == "mxfp4" ? "mxfp4" : weight_dtype);
  });
}

}  // namespace hyla::cli
