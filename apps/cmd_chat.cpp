// `hyla chat`: an interactive terminal chat in the format of SPEC §8. Each turn re-sends the whole
// conversation; the engine's prompt-state cache restores the part it has already read, so a turn
// costs only its new tokens. On a terminal, lines are edited and recalled with libedit (history
// kept in a file) and Ctrl-C stops a reply; from a pipe, each reply ends with a delimiter line so
// a script can split them. Either way a notice on stderr says when the context is full.
#include <editline/readline.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "commands.h"
#include "hyla/data/image_file.h"
#include "hyla/core/error.h"
#include "hyla/data/chat_template.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/reply_stream.h"
#include "hyla/data/tokenizer.h"
#include "hyla/dist/expert_serving.h"
#include "hyla/infer/engine.h"
#include "hyla/model/model.h"

namespace hyla::cli {

namespace {

std::atomic<bool> interrupted{false};
void on_interrupt(int) { interrupted = true; }

// Ctrl-C ends the reply being generated (not the chat) while one of these lives.
class InterruptStopsReply {
 public:
  InterruptStopsReply() {
    interrupted = false;
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigaction(SIGINT, &action, &previous_);
  }
  ~InterruptStopsReply() { sigaction(SIGINT, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

std::string default_history_file() {
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) return std::string(state) + "/hyla/chat_history";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/state/hyla/chat_history";
  return "";
}

// One line from the user: edited with history on a terminal, plain from a pipe; nullopt at EOF.
std::optional<std::string> read_line(bool interactive) {
  if (!interactive) {
    std::string line;
    if (!std::getline(std::cin, line)) return std::nullopt;
    return line;
  }
  char* raw = readline("> ");
  if (!raw) return std::nullopt;
  std::string line(raw);
  std::free(raw);
  if (!line.empty()) add_history(line.c_str());
  return line;
}

}  // namespace

void add_chat(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat", "Chat with a model in the terminal (/image FILE attaches an image to the next "
                                          "message, /reset clears the conversation, /exit or EOF quits)");
  static std::string model_dir, system, dtype = "bf16", delimiter = "<|im_end|>", history_file = default_history_file();
  static SamplingParams sampling;
  static int64_t max_tokens = 512, context = 4096;
  static ExpertMemoryArgs expert_memory;
  static std::filesystem::path mmproj;
  cmd->add_option("-m,--model", model_dir, "Model directory (with tokenizer.json)")->required();
  cmd->add_option("--system", system, "System message");
  cmd->add_option("-n,--max-tokens", max_tokens, "Most tokens per reply")->check(positive());
  add_sampling_options(cmd, sampling);
  cmd->add_option("-c,--context,--ctx-size", context, "Conversation tokens kept (older turns are dropped)")->check(CLI::Range(64, 1 << 24));
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--delimiter", delimiter, "When input is not a terminal: the line printed after each reply");
  cmd->add_option("--history", history_file, "On a terminal: the file of past input lines (empty: none)");
  add_expert_memory_options(cmd, expert_memory);
  add_mmproj_option(cmd, mmproj);
  cmd->callback([cmd] {
    if (serve_experts_to_rank0(model_dir)) return;
    ModelLoadOptions load = expert_memory.load_options();
    load.mmproj = mmproj;
    load.bf16_matrices = dtype == "bf16";
    const std::unique_ptr<Model> model = load_model_for_engine(model_dir, load);
    const Tokenizer tokenizer = load_model_tokenizer(model_dir);
    const ChatTemplate chat(tokenizer);
    context = fit_default_context(*model, context, cmd->count("--context") > 0, "chat");
    EngineOptions options;
    options.max_sequences = 1;
    options.context = context;
    options.precision = dtype == "bf16" ? Precision::BF16 : Precision::F32;
    options.prefill_chunk = 64;  // prompt states are reusable at multiples of this
    Engine engine(*model, tokenizer, options);
    const bool interactive = isatty(STDIN_FILENO);
    if (interactive && !history_file.empty()) {
      std::error_code ignored;  // a history that cannot be kept is no reason not to chat
      std::filesystem::create_directories(std::filesystem::path(history_file).parent_path(), ignored);
      read_history(history_file.c_str());
    }
    std::vector<ChatMessage> history;
    std::vector<ChatImage> attached;  // /image: for the next user message
    const int64_t patch_size = model->config().vision.position_pixels();
    if (!system.empty()) history.push_back({"system", system, {}, {}, {}});
    const size_t fixed = history.size();
    if (interactive)
      fmt::print(stderr, "hyla chat: {} (/reset, /exit; Ctrl-C stops a reply); {}\n", model_dir, engine.memory_summary());
    for (;;) {
      std::fflush(stdout);
      const std::optional<std::string> line = read_line(interactive);
      if (!line || *line == "/exit") break;
      if (*line == "/reset") {
        history.resize(fixed);
        attached.clear();
        continue;
      }
      if (line->starts_with("/image")) {
        // A file that cannot be read or that the model cannot take is reported, and the chat goes on.
        const std::string file = line->size() > 7 ? line->substr(7) : std::string();
        try {
          HYLA_CHECK(!file.empty(), "/image needs a file: /image PATH");
          HYLA_CHECK(model->config().vision.enabled, "{} does not read images (vision.enabled is false)", model_dir);
          attached.push_back({0, to_model_image(read_image_file(file), model->config().vision, file)});
          fmt::print(stderr, "[image {}: {}x{}, {} positions; it goes with your next message]\n", file,
                     attached.back().image.width, attached.back().image.height,
                     attached.back().image.height / patch_size * (attached.back().image.width / patch_size) + 2);
        } catch (const Error& e) {
          fmt::print(stderr, "[{}]\n", e.what());
        }
        if (!interactive) fmt::print("{}\n", delimiter);
        continue;
      }
      if (line->empty()) continue;
      history.push_back({"user", *line, {}, std::move(attached), {}});
      attached.clear();
      GenerationRequest request;
      request.sampling = sampling;
      request.prompt = chat.encode(history, /*add_generation_prompt=*/true, {}, patch_size);
      // Drop the oldest turns (never the system message) until the reply fits.
      int64_t dropped = 0;
      while (int64_t(request.prompt.size()) + max_tokens > context && history.size() > fixed + 1) {
        history.erase(history.begin() + int64_t(fixed));
        request.prompt = chat.encode(history, true, {}, patch_size);
        ++dropped;
      }
      if (dropped > 0)
        fmt::print(stderr, "[context full ({} tokens): dropped the {} oldest message{}]\n", context, dropped,
                   dropped == 1 ? "" : "s");
      request.images = chat_images(history);
      request.max_tokens = std::min<int64_t>(max_tokens, context - int64_t(request.prompt.size()));
      if (request.max_tokens < 1) {
        fmt::print(stderr, "[context full: this message alone takes {} of the {} tokens; not sent]\n", request.prompt.size(),
                   context);
        history.pop_back();
        if (!interactive) fmt::print("{}\n", delimiter);
        continue;
      }
      // A reply streams through its chat format: a think channel (Kimi K3) dimmed on a terminal,
      // the format's markers never shown.
      ReplyStream stream(chat, {});
      const bool terminal = isatty(STDOUT_FILENO);
      const auto show = [terminal](const ReplyStream::Delta& delta) {
        if (!delta.reasoning.empty()) {
          if (terminal) fmt::print("\x1b[2m");
          print_generated(delta.reasoning, terminal);
          if (terminal) fmt::print("\x1b[0m");
        }
        print_generated(delta.content, terminal);
      };
      request.on_text = [&](std::string_view text) {
        show(stream.push(text));
        return !interrupted;
      };
      GenerationOutput out;
      {
        const std::optional<InterruptStopsReply> ctrl_c = interactive ? std::optional<InterruptStopsReply>(std::in_place) : std::nullopt;
        out = engine.submit(request).get();
      }
      const AssistantReply rest = stream.finish().reply;
      show({rest.content, rest.reasoning, {}});
      fmt::print("\n");
      if (!interactive) fmt::print("{}\n", delimiter);
      std::fflush(stdout);
      const AssistantReply reply = chat.parse_reply(out.text);
      history.push_back({"assistant", reply.content, {}, {}, reply.reasoning});
      if (out.finish_reason == FinishReason::Cancelled) fmt::print(stderr, "[stopped]\n");
      if (out.finish_reason == FinishReason::Length)
        fmt::print(stderr, "[reply cut at {} tokens: {}]\n", out.tokens.size(),
                   request.max_tokens < max_tokens ? fmt::format("the context of {} tokens is full", context)
                                                   : fmt::format("--max-tokens {}", max_tokens));
      const double decode = out.seconds - out.time_to_first_token;
      if (interactive)
        fmt::print(stderr, "[{} prompt tokens ({} cached) at {:.0f} t/s, {} generated at {:.1f} t/s]\n", out.prompt_tokens,
                   out.cached_prompt_tokens,
                   double(out.prompt_tokens - out.cached_prompt_tokens) / std::max(out.time_to_first_token, 1e-9),
                   out.tokens.size(), double(out.tokens.size() - 1) / std::max(decode, 1e-9));
    }
    if (interactive && !history_file.empty()) write_history(history_file.c_str());
  });
}

}  // namespace hyla::cli
