// `hyla chat`: an interactive terminal chat in the format of SPEC §8. Each turn re-sends the whole
// conversation; the engine's prompt-state cache restores the part it has already read, so a turn
// costs only its new tokens.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/data/chat_template.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/engine.h"
#include "hyla/model/model.h"

namespace hyla::cli {

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Chat with a model in the terminal (/reset clears the conversation, /exit or EOF quits)");
  static std::string model_dir, system, dtype = "bf16";
  static SamplingParams sampling;
  static int64_t max_tokens = 512, context = 4096;
  cmd->add_option("-m,--model", model_dir, "Model directory (with tokenizer.json)")->required();
  cmd->add_option("--system", system, "System message");
  cmd->add_option("-n,--max-tokens", max_tokens, "Most tokens per reply")->check(positive());
  add_sampling_options(cmd, sampling);
  cmd->add_option("-c,--context,--ctx-size", context, "Conversation tokens kept (older turns are dropped)")->check(CLI::Range(64, 1 << 24));
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([] {
    const std::unique_ptr<Model> model = load_model_for_engine(model_dir);
    const Tokenizer tokenizer = Tokenizer::load(std::filesystem::path(model_dir) / "tokenizer.json");
    EngineOptions options;
    options.max_sequences = 1;
    options.context = context;
    options.precision = dtype == "bf16" ? Precision::BF16 : Precision::F32;
    options.prefill_chunk = 64;  // prompt states are reusable at multiples of this
    Engine engine(*model, tokenizer, options);
    const bool interactive = isatty(STDIN_FILENO);
    std::vector<ChatMessage> history;
    if (!system.empty()) history.push_back({"system", system, {}});
    const size_t fixed = history.size();
    if (interactive) fmt::print(stderr, "hyla chat: {} (/reset, /exit); {}\n", model_dir, engine.memory_summary());
    std::string line;
    for (;;) {
      if (interactive) fmt::print("> ");
      std::fflush(stdout);
      if (!std::getline(std::cin, line) || line == "/exit") break;
      if (line == "/reset") {
        history.resize(fixed);
        continue;
      }
      if (line.empty()) continue;
      history.push_back({"user", line, {}});
      GenerationRequest request;
      request.sampling = sampling;
      request.prompt = encode_chat(tokenizer, history, /*add_generation_prompt=*/true);
      // Drop the oldest turns (never the system message) until the reply fits.
      while (int64_t(request.prompt.size()) + max_tokens > context && history.size() > fixed + 1) {
        history.erase(history.begin() + int64_t(fixed));
        request.prompt = encode_chat(tokenizer, history, true);
      }
      request.max_tokens = std::min<int64_t>(max_tokens, context - int64_t(request.prompt.size()));
      if (request.max_tokens < 1) {
        fmt::print(stderr, "hyla chat: the message alone exceeds the context of {} tokens\n", context);
        history.pop_back();
        continue;
      }
      request.on_text = [](std::string_view text) {
        fmt::print("{}", text);
        std::fflush(stdout);
        return true;
      };
      const GenerationOutput out = engine.submit(request).get();
      fmt::print("\n");
      history.push_back({"assistant", out.text, {}});
      const double decode = out.seconds - out.time_to_first_token;
      if (interactive)
        fmt::print(stderr, "[{} prompt tokens ({} cached) at {:.0f} t/s, {} generated at {:.1f} t/s]\n", out.prompt_tokens,
                   out.cached_prompt_tokens,
                   double(out.prompt_tokens - out.cached_prompt_tokens) / std::max(out.time_to_first_token, 1e-9),
                   out.tokens.size(), double(out.tokens.size() - 1) / std::max(decode, 1e-9));
    }
  });
}

}  // namespace hyla::cli
