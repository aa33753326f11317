// `hyla eval longctx`: the long-context suite, retrieval and synthesis tiers over lengths and
// depths, with the no-context and contamination controls (docs/longctx.md).
#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "commands.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/core/byte_size.h"
#include "hyla/eval/interval.h"
#include "hyla/eval/longctx_eval.h"
#include "hyla/eval/longctx_report.h"
#include "hyla/io/file.h"

namespace hyla::cli {

namespace fs = std::filesystem;

namespace {

// "4096", "4K" (4096), "1M" (1,048,576).
int64_t parse_length(const std::string& text) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    fail("--lengths: '{}' is not a length (a number of tokens, K = 1024, M = 1048576)", text);
  }
  const std::string unit = text.substr(used);
  HYLA_CHECK(unit.empty() || unit == "K" || unit == "k" || unit == "M" || unit == "m",
             "--lengths: '{}' has an unknown unit (K = 1024 tokens, M = 1048576)", text);
  const int64_t scale = unit.empty() ? 1 : (unit == "K" || unit == "k") ? 1024 : 1 << 20;
  HYLA_CHECK(value > 0 && value <= (int64_t(1) << 26) / scale, "--lengths: '{}' is outside 256 tokens .. 64M", text);
  return value * scale;
}

}  // namespace

void add_eval_longctx(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("longctx", "Long-context retrieval and synthesis accuracy over lengths and depths "
                                             "(RULER-style tasks), with a no-context control");
  static std::string model_dir, server, api_key, tokenizer_file, haystack_file = "data/kjv.txt", train_text_file,
                     dtype = "bf16", memory = "8GiB", out_file, report_file;
  static std::vector<std::string> tasks, lengths = {"1K", "2K", "4K", "8K"};
  static std::vector<double> depths = {0, 0.25, 0.5, 0.75, 1};
  static int64_t samples = 0, max_sequences = 8, prefill_chunk = 2048;
  static uint64_t seed = 1;
  static bool print_json = false, no_control = false, paraphrase = false;
  auto* model_option = cmd->add_option("-m,--model", model_dir, "Model directory");
  auto* server_option = cmd->add_option("--server", server, "Ask a running `hyla serve` instead (http://host:port), "
                                                            "with the same token ids through /v1/completions");
  model_option->excludes(server_option);
  cmd->add_option("--api-key", api_key, "The server's API key");
  cmd->add_option("--tokenizer", tokenizer_file, "tokenizer.json (default: the model's; needed with --server)");
  cmd->add_option("--tasks", tasks, "Comma-separated tasks (default: all of them): " + describe_longctx_tasks())
      ->delimiter(',');
  cmd->add_option("--lengths", lengths, "Comma-separated lengths in tokens, prompt and answer (K = 1024, M = 1048576)")
      ->delimiter(',');
  cmd->add_option("--depths", depths, "Comma-separated needle depths in [0, 1], for the tasks that place one needle")
      ->delimiter(',');
  cmd->add_option("--samples", samples, "Samples per cell (0: 100 up to 8K, 25 up to 128K, 5 beyond)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", seed, "Seed of the generators (printed with the generator's version in every result)");
  cmd->add_option("--haystack", haystack_file, "Text the haystacks are cut from, one sentence a line "
                                               "(hyla data fetch kjv --out data/kjv.txt)");
  cmd->add_option("--train-text", train_text_file, "The model's training text: checks that no planted sentence is in it");
  cmd->add_flag("--no-control", no_control, "Skip the no-context control");
  cmd->add_flag("--paraphrase", paraphrase,
                "Paraphrased templates: every instruction, planted sentence and question in other words than "
                "RULER's (the ones training draws), the same keys, values and places");
  cmd->add_option("--max-sequences", max_sequences, "Sequences decoded together (fewer where --memory says)")
      ->check(positive());
  cmd->add_option("--memory", memory, "State memory all sequences of a length may take (e.g. 4GiB)");
  cmd->add_option("--prefill-chunk", prefill_chunk, "Prompt tokens per forward")->check(positive());
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--out", out_file, "Write the JSON results here");
  cmd->add_option("--report", report_file, "Write a self-contained HTML report here");
  cmd->add_flag("--json", print_json, "Print the JSON results instead of the tables");
  cmd->callback([] {
    HYLA_CHECK(!model_dir.empty() || !server.empty(), "give a model (--model DIR) or a server (--server URL)");
    HYLA_CHECK(!server.empty() || api_key.empty(), "--api-key is for --server");
    HYLA_CHECK(!tokenizer_file.empty() || !model_dir.empty(), "--server needs --tokenizer (the served model's tokenizer.json)");
    LongCtxOptions o;
    o.tasks = tasks.empty() ? default_longctx_tasks() : tasks;
    for (const std::string& name : o.tasks) longctx_task(name);  // an unknown name fails before anything loads
    for (const std::string& l : lengths) o.lengths.push_back(parse_length(l));
    o.depths = depths;
    o.samples = samples;
    o.seed = seed;
    o.wording = paraphrase ? LongCtxWording::Paraphrased : LongCtxWording::Ruler;
    o.max_sequences = max_sequences;
    const std::optional<int64_t> budget = parse_byte_size(memory);
    HYLA_CHECK(budget && *budget > 0, "--memory {}: give bytes with a unit (e.g. 4GiB)", memory);
    o.memory_budget = *budget;
    o.prefill_chunk = prefill_chunk;
    o.precision = dtype == "f32" ? Precision::F32 : Precision::BF16;
    o.server = server;
    o.api_key = api_key;
    o.no_context_control = !no_control;
    HYLA_CHECK(fs::exists(haystack_file), "--haystack {}: no such file (hyla data fetch kjv --out data/kjv.txt)",
               haystack_file);
    const std::string haystack = read_file(haystack_file);
    if (!train_text_file.empty()) o.train_text = read_file(train_text_file);
    const Tokenizer tokenizer =
        tokenizer_file.empty() ? load_model_tokenizer(model_dir) : Tokenizer::load(tokenizer_file);
    std::unique_ptr<Model> model;
    if (!model_dir.empty()) model = Model::load(model_dir);
    LongCtxResult result = evaluate_longctx(model.get(), tokenizer, haystack, haystack_file, o);
    if (!model_dir.empty()) result.model = model_dir;
    // A model's answer may end inside a UTF-8 character (or be any bytes at all): written as U+FFFD.
    const std::string json = longctx_json(result).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    if (!out_file.empty()) write_file_atomic(out_file, json + "\n");
    if (!report_file.empty()) write_file_atomic(report_file, longctx_html(result));
    if (print_json) {
      fmt::print("{}\n", json);
      return;
    }
    fmt::print("generator {}, seed {}, wording {}, model {}, haystack {}\n", result.generator, result.seed,
               to_string(result.wording), result.model, result.haystack);
    auto cell_text = [](const LongCtxCell& c) {
      const Interval ci = wilson_interval(c.correct, c.samples);
      return fmt::format("{:5.1f}% [{:.1f}, {:.1f}] n={}", 100 * c.accuracy(), 100 * ci.low, 100 * ci.high, c.samples);
    };
    for (const LongCtxCell& c : result.cells)
      fmt::print("{:<18} {:<9} {:>6} {:>6}  {}\n", c.task, to_string(c.tier), format_length(c.length),
                 c.depth < 0 ? std::string("spread") : fmt::format("{:.2f}", c.depth), cell_text(c));
    for (const LongCtxResult::Skipped& s : result.skipped)
      fmt::print("skipped: {} at {} ({})\n", s.task, format_length(s.length), s.reason);
    for (const LongCtxLength& l : result.lengths)
      fmt::print("length {:>6}: {} samples in {:.1f} s ({:.0f} prompt tok/s), {} sequence(s) of {:.1f} MiB state, "
                 "peak RSS {:.0f} MiB\n",
                 format_length(l.length), l.samples, l.seconds, double(l.prompt_tokens) / std::max(l.seconds, 1e-9),
                 l.sequences, double(l.state_bytes_per_sequence) / (1 << 20), double(l.peak_rss_bytes) / (1 << 20));
    for (const LongCtxCell& c : result.no_context) fmt::print("no context: {:<18} {}\n", c.task, cell_text(c));
    if (result.contamination_checked)
      fmt::print("contamination: {} of {} samples have a planted sentence in {}\n", result.contamination_found,
                 result.contamination_samples, train_text_file);
    if (!report_file.empty()) fmt::print("report: {}\n", report_file);
  });
}

}  // namespace hyla::cli
