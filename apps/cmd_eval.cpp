// `hyla eval`: validation loss and perplexity of a model directory over a whole split.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "commands.h"
#include "hyla/eval/perplexity.h"

namespace hyla::cli {

namespace {

// "int8 (block 32) for 212 of 226 weight matrices", "MXFP4 for 96 of 226 …" or "floating point".
std::string weight_storage(const ParamStore& params) {
  int64_t int8 = 0, mxfp4 = 0, matrices = 0, block = 0;
  for (const auto& p : params.params()) {
    matrices += p->int8_allowed;
    if (p->is_int8()) ++int8, block = p->int8_block;
    mxfp4 += p->is_mxfp4();
  }
  std::vector<std::string> parts;
  if (int8) parts.push_back(fmt::format("int8 (block {}) for {}", block, int8));
  if (mxfp4) parts.push_back(fmt::format("MXFP4 for {}", mxfp4));
  if (parts.empty()) return "floating point";
  return fmt::format("{} of {} matrix-product weights", fmt::join(parts, " and "), matrices);
}

}  // namespace

void add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Validation loss and perplexity of a model over a whole split of a token "
                                          "directory; `eval images` for image tasks, `eval longctx` for long context");
  static std::string model_dir, data_dir, split = "val", dtype = "bf16";
  static int64_t seq_len = 1024, batch = 4;
  add_eval_images(*cmd);
  add_eval_longctx(*cmd);
  add_eval_agent(*cmd);
  // Not marked required: `hyla eval images` and `eval longctx` take their own; without a subcommand
  // both are checked below.
  cmd->add_option("-m,--model", model_dir, "Model directory or GGUF file");
  cmd->add_option("--data", data_dir, "Prepared token directory (hyla data prepare)");
  cmd->add_option("--split", split, "Split listed in the directory's meta.json");
  cmd->add_option("--dtype", dtype,
                  "Matmul inputs, as for generate, chat, serve and bench (int8 weights, from hyla quantize, always "
                  "run int8 products)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--seq", seq_len, "Tokens per window")->check(positive());
  cmd->add_option("--batch", batch, "Windows per forward")->check(positive());
  cmd->callback([cmd] {
    if (cmd->got_subcommand("images") || cmd->got_subcommand("longctx") || cmd->got_subcommand("agent")) return;
    HYLA_CHECK(!model_dir.empty() && !data_dir.empty(),
               "hyla eval needs --model and --data (or a subcommand: images, longctx, agent)");
    auto model = Model::load(model_dir);
    const Precision precision = dtype == "f32" ? Precision::F32 : Precision::BF16;
    const PerplexityResult r = evaluate_perplexity(*model, data_dir, split, seq_len, batch, precision, true);
    HYLA_CHECK(r.tokens > 0, "{}: the {} split has no tokens to predict", data_dir, split);
    fmt::print("{} loss {:.4f}, perplexity {:.3f} over {} tokens (windows of {}; {} products; weights {}) in {:.1f} s\n",
               split, r.loss, r.perplexity(), r.tokens, seq_len, precision == Precision::F32 ? "f32" : "bf16",
               weight_storage(model->params()), r.seconds);
  });
}

}  // namespace hyla::cli
