// `hyla generate`: streams a continuation of a prompt and reports prefill and decode speed.
#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/data/image_file.h"
#include "hyla/data/image_text.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/data/utf8.h"
#include "hyla/dist/expert_serving.h"
#include "hyla/infer/engine.h"
#include "hyla/infer/json_grammar.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/model/model.h"

namespace hyla::cli {
namespace {

// The prompt piped in (`echo text | hyla generate -m DIR`); a terminal on stdin is not a prompt.
std::string read_prompt_from_stdin() {
  HYLA_CHECK(!isatty(STDIN_FILENO), "generate: give the prompt with --prompt, --file or on standard input");
  return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a model directory; text streams to stdout");
  static std::string model_dir, prompt, prompt_file, dtype = "bf16", json_schema, json_schema_file;
  static GenerationRequest request;
  static int64_t context = 4096, prefill_chunk = 512;
  static ExpertMemoryArgs expert_memory;
  static std::filesystem::path mmproj;
  static std::vector<std::string> image_files;
  cmd->add_option("-m,--model", model_dir, "Model directory (with tokenizer.json)")->required();
  cmd->add_option("--image", image_files,
                  "PNG or JPEG read with the prompt (repeatable): each takes the place of the next <image> in the prompt, "
                  "images beyond the markers go first; never resized (docs/vision.md)");
  auto* text = cmd->add_option("-p,--prompt", prompt, "Prompt text (default: --file, else standard input)");
  cmd->add_option("-f,--file", prompt_file, "Read the prompt from this file")->excludes(text)->check(CLI::ExistingFile);
  cmd->add_option("-n,--max-tokens", request.max_tokens, "Tokens to generate")->check(positive());
  add_sampling_options(cmd, request.sampling);
  cmd->add_option("--stop", request.stop, "Stop strings (repeatable)");
  cmd->add_flag("--ignore-eos{false}", request.stop_at_end_tokens,
                "Go on past end-of-text tokens to --max-tokens (llama-cli's --ignore-eos, the API's ignore_eos)");
  auto* context_option =
      cmd->add_option("-c,--context,--ctx-size", context, "Maximum tokens of prompt + generation")->check(positive());
  cmd->add_option("--prefill-chunk", prefill_chunk, "Prompt tokens per forward")->check(positive());
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  auto* schema = cmd->add_option("-j,--json-schema", json_schema, "Generate only JSON of this schema ('{}': any JSON value)");
  cmd->add_option("--json-schema-file", json_schema_file, "The same, read from a file")->excludes(schema)->check(CLI::ExistingFile);
  add_expert_memory_options(cmd, expert_memory);
  add_mmproj_option(cmd, mmproj);
  cmd->callback([text, context_option] {
    if (!prompt_file.empty()) prompt = read_file(prompt_file);
    else if (text->count() == 0) prompt = read_prompt_from_stdin();
    if (!json_schema_file.empty()) request.grammar = json_schema_grammar(parse_json_file(json_schema_file), json_schema_file);
    else if (!json_schema.empty()) request.grammar = json_schema_grammar(parse_json(json_schema, "--json-schema"), "--json-schema");
    if (serve_experts_to_rank0(model_dir)) return;
    ModelLoadOptions load = expert_memory.load_options();
    load.mmproj = mmproj;
    load.bf16_matrices = dtype == "bf16";
    const std::unique_ptr<Model> model = load_model_for_engine(model_dir, load);
    const Tokenizer tokenizer = load_model_tokenizer(model_dir);
    for (const std::string& file : image_files)
      request.images.push_back(to_model_image(read_image_file(file), model->config().vision, file));
    request.prompt = request.images.empty()
                         ? tokenizer.encode(prompt, /*allow_special=*/true)
                         : encode_with_images(tokenizer, prompt, request.images, model->config().vision.position_pixels(), true);
    HYLA_CHECK(!request.prompt.empty(), "generate: the prompt encodes to no tokens");
    EngineOptions options;
    options.max_sequences = 1;
    // A default context past the model's window ends the generation at the window.
    options.context = fit_default_context(
        *model, std::min<int64_t>(context, int64_t(request.prompt.size()) + request.max_tokens + 1),
        context_option->count() > 0, "generate");
    request.max_tokens = std::min<int64_t>(request.max_tokens, options.context - int64_t(request.prompt.size()));
    options.prefill_chunk = prefill_chunk;
    options.precision = dtype == "bf16" ? Precision::BF16 : Precision::F32;
    options.prefix_cache_bytes = 0;
    Engine engine(*model, tokenizer, options);
    fmt::print(stderr, "{}\n", engine.memory_summary());
    fmt::print("{}", prompt);
    request.on_text = [terminal = bool(isatty(STDOUT_FILENO))](std::string_view text) {
      print_generated(text, terminal);
      return true;
    };
    const GenerationOutput r = engine.submit(request).get();
    fmt::print("\n");
    const double decode = r.seconds - r.time_to_first_token;
    fmt::print(stderr, "prompt {} tokens: {:.1f} tokens/s prefill; generated {} tokens: {:.1f} tokens/s decode ({})\n",
               r.prompt_tokens, double(r.prompt_tokens) / r.time_to_first_token, r.tokens.size(),
               double(r.tokens.size() - 1) / std::max(decode, 1e-9), to_string(r.finish_reason));
    if (const ExpertOffload* offload = model->expert_offload()) fmt::print(stderr, "{}\n", offload->summary());
  });
}

void print_generated(std::string_view text, bool terminal) {
  if (terminal) fmt::print("{}", visible_controls(text));
  else fmt::print("{}", text);
  std::fflush(stdout);
}

void add_sampling_options(CLI::App* cmd, SamplingParams& sampling) {
  cmd->add_option("--temperature", sampling.temperature, "0 for greedy")->check(non_negative());
  cmd->add_option("--top-k", sampling.top_k, "Keep the k most likely tokens (0: all)")->check(non_negative());
  cmd->add_option("--top-p", sampling.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", sampling.min_p, "Drop tokens below min-p × the top probability")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", sampling.seed, "Sampling seed");
  cmd->add_option("--frequency-penalty", sampling.frequency_penalty, "Logit drop per time a token was generated")
      ->check(CLI::Range(-2.0, 2.0));
  cmd->add_option("--presence-penalty", sampling.presence_penalty, "Logit drop for every token generated before")
      ->check(CLI::Range(-2.0, 2.0));
  // llama.cpp's spelling: TOKEN_ID followed by a signed bias, e.g. 15043+1.5 or 42-100.
  cmd->add_option_function<std::vector<std::string>>(
         "--logit-bias",
         [&sampling](const std::vector<std::string>& items) {
           for (const std::string& item : items) {
             const size_t sign = item.find_first_of("+-", 1);
             int32_t token = -1;
             double bias = 0;
             const bool ok = sign != std::string::npos &&
                             std::from_chars(item.data(), item.data() + sign, token).ptr == item.data() + sign &&
                             std::from_chars(item.data() + sign + (item[sign] == '+'), item.data() + item.size(), bias).ptr ==
                                 item.data() + item.size();
             if (!ok || token < 0 || !(bias >= -100 && bias <= 100))
               throw CLI::ValidationError("--logit-bias",
                                          "'" + item + "' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS with a bias in [-100, 100]");
             sampling.logit_bias.emplace_back(token, float(bias));
           }
         },
         "Add BIAS to a token's logit: TOKEN_ID+BIAS or TOKEN_ID-BIAS (repeatable)")
      ->type_name("ID±BIAS");
}

}  // namespace hyla::cli
