// `hyla generate`: streams a continuation of a prompt and reports prefill and decode speed.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/generator.h"
#include "hyla/model/model.h"

namespace hyla::cli {

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a model directory; text streams to stdout");
  static std::string model_dir, prompt, dtype = "bf16";
  static GenerationOptions o;
  static int64_t context = 4096;
  cmd->add_option("--model", model_dir, "Model directory (with tokenizer.json)")->required();
  cmd->add_option("--prompt", prompt, "Prompt text")->required();
  cmd->add_option("-n,--max-tokens", o.max_tokens, "Tokens to generate")->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o.sampling.temperature, "0 for greedy")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", o.sampling.top_k, "Keep the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o.sampling.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", o.sampling.min_p, "Drop tokens below min-p × the top probability")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", o.sampling.seed, "Sampling seed");
  cmd->add_option("--stop", o.stop, "Stop strings (repeatable)");
  cmd->add_option("--context", context, "Maximum tokens of prompt + generation")->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "Prompt tokens per forward")->check(CLI::PositiveNumber);
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([] {
    auto model = Model::load(model_dir);
    const Tokenizer tokenizer = Tokenizer::load(std::filesystem::path(model_dir) / "tokenizer.json");
    o.precision = dtype == "bf16" ? Precision::BF16 : Precision::F32;
    const std::vector<int32_t> ids = tokenizer.encode(prompt, /*allow_special=*/true);
    HYLA_CHECK(!ids.empty(), "generate: the prompt encodes to no tokens");
    HYLA_CHECK(int64_t(ids.size()) < context, "generate: the prompt ({} tokens) fills the context of {}", ids.size(), context);
    SequenceState state(*model, std::min<int64_t>(context, int64_t(ids.size()) + o.max_tokens));
    fmt::print("{}", prompt);
    std::fflush(stdout);
    const GenerationResult r = generate(*model, tokenizer, ids, o, state, [](std::string_view text) {
      fmt::print("{}", text);
      std::fflush(stdout);
      return true;
    });
    fmt::print("\n");
    fmt::print(stderr, "prompt {} tokens: {:.1f} tokens/s prefill; generated {} tokens: {:.1f} tokens/s decode ({})\n",
               r.prompt_tokens, double(r.prompt_tokens) / r.prefill_seconds, r.tokens.size(),
               double(r.tokens.size()) / std::max(r.decode_seconds, 1e-9), r.finish_reason);
  });
}

}  // namespace hyla::cli
