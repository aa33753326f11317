#pragma once
// Each subcommand lives in its own apps/cmd_*.cpp and registers itself on the root app.
#include <CLI/CLI.hpp>

#include <string>
#include <string_view>

#include "hyla/infer/sampler.h"
#include "hyla/model/model.h"

namespace hyla::cli {

void add_version(CLI::App& app);
void add_inspect(CLI::App& app);
void add_init(CLI::App& app);
void add_plan(CLI::App& app);
void add_bench(CLI::App& app);
void add_logits(CLI::App& app);
void add_train(CLI::App& app);
void add_report(CLI::App& app);
void add_generate(CLI::App& app);
void add_serve(CLI::App& app);
void add_chat(CLI::App& app);
void add_tokenizer(CLI::App& app);
void add_data(CLI::App& app);
void add_quantize(CLI::App& app);
void add_convert(CLI::App& app);
void add_eval(CLI::App& app);
void add_eval_images(CLI::App& eval);   // `hyla eval images`, beside eval's own perplexity
void add_eval_longctx(CLI::App& eval);  // `hyla eval longctx`
void add_eval_agent(CLI::App& eval);    // `hyla eval agent`
void add_agent(CLI::App& app);
void add_rl(CLI::App& app);

// Flag checks with readable messages (cli_checks.cpp): finite and > 0, finite and >= 0.
const CLI::Validator& positive();
const CLI::Validator& non_negative();

// A flag that was renamed: the old spelling stays hidden and fails naming the new one, so an old
// script stops with the fix rather than "argument was not expected".
void refuse_renamed(CLI::App* cmd, const std::string& old_name, const std::string& new_name, const std::string& why);
inline constexpr const char* kDtypeMeansMatmulInputs = "--dtype means the matmul inputs, on every command that computes";

// The sampling flags (temperature, top-k/p, min-p, seed, penalties, logit bias), shared by generate and chat.
void add_sampling_options(CLI::App* cmd, SamplingParams& sampling);

// --expert-memory, --expert-cache and --expert-prefetch (offload_options.cpp), shared by
// generate, chat, serve and bench.
struct ExpertMemoryArgs {
  std::string memory;  // empty: every expert resident
  std::string policy = "lru";
  std::string prefetch = "auto";  // on a box whose cores all compute, the I/O thread slows decoding (docs/offload.md)
  ModelLoadOptions load_options() const;
};
void add_expert_memory_options(CLI::App* cmd, ExpertMemoryArgs& args);
// --mmproj (offload_options.cpp), shared by generate, chat, serve and logits: ModelLoadOptions::mmproj.
void add_mmproj_option(CLI::App* cmd, std::filesystem::path& mmproj);

// Streamed model text to stdout, flushed; on a terminal with control bytes made visible (utf8.h).
void print_generated(std::string_view text, bool terminal);

}  // namespace hyla::cli
