// `hyla serve`: the OpenAI-compatible HTTP server (see src/hyla/serve/server.h).
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <ctime>
#include <optional>
#include <thread>

#include "commands.h"
#include "hyla/core/byte_size.h"
#include "hyla/core/error.h"
#include "hyla/dist/expert_serving.h"
#include "hyla/io/file.h"
#include "hyla/serve/server.h"

namespace hyla::cli {

namespace {

std::string read_key_file(const std::string& path) {
  std::string key = read_file(path);
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  HYLA_CHECK(!key.empty(), "{}: the API key file is empty", path);
  return key;
}

}  // namespace

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  static ServeOptions options;
  static ExpertMemoryArgs expert_memory;
  static std::filesystem::path mmproj;
  static std::string dtype = "bf16", cache_dtype = "bf16";
  static int64_t prefix_cache_mb = 256, max_body_kb = 4096;
  static std::string memory;
  static std::string api_key_file;
  static std::optional<double> min_confidence;
  cmd->add_option("-m,--model", options.model_dir, "Model directory (with tokenizer.json)")->required();
  cmd->add_option("--host", options.host, "Address to listen on");
  cmd->add_option("--port", options.port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--model-name,--served-model-name,--alias", options.model_name,
                  "Model id clients use (default: the directory name)");
  auto* key = cmd->add_option("--api-key", options.api_key,
                              "Require 'Authorization: Bearer KEY' on /v1 routes (visible in ps: prefer the file or $HYLA_API_KEY)")
                  ->envname("HYLA_API_KEY");
  cmd->add_option("--api-key-file", api_key_file, "Read the API key from this file")->excludes(key);
  cmd->add_flag("--metrics-need-key", options.metrics_need_key, "Require the API key on /metrics too");
  cmd->add_option("--cors-origin", options.cors_origins,
                  "Browser origin allowed to call the API, e.g. http://localhost:3000 (repeatable; * for any)");
  cmd->add_option("--max-sequences,--parallel", options.engine.max_sequences, "Sequences decoded together")->check(positive());
  cmd->add_option("-c,--context,--ctx-size", options.engine.context, "Tokens per sequence (prompt + completion)")->check(CLI::Range(2, 1 << 24));
  cmd->add_option("--prefill-chunk", options.engine.prefill_chunk, "Prompt tokens per forward")->check(positive());
  cmd->add_option("--dtype", dtype, "Matmul inputs")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--cache-dtype", cache_dtype, "Latent KV cache values")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--prefix-cache-mb", prefix_cache_mb, "Memory for reusable prompt states (0: off)")->check(non_negative());
  cmd->add_option("--snapshot-every", options.engine.snapshot_interval,
                  "Snapshot a prompt's state every N tokens (and at each turn's end): a prompt sharing a cached "
                  "prefix re-reads at most N of its tokens")
      ->check(positive());
  cmd->add_option("--memory", memory, "State memory the slots at full context and the prompt-state cache may take "
                                      "(e.g. 8GiB; default: half the machine's memory)");
  cmd->add_option("--max-tokens", options.limits.max_tokens, "Largest max_tokens a request may ask for")->check(positive());
  cmd->add_option("--max-body-kb", max_body_kb, "Largest request body")->check(positive());
  cmd->add_option("--max-images", options.limits.max_images, "Image parts a chat request may carry")->check(non_negative());
  cmd->add_option("--max-image-bytes", options.limits.max_image_bytes, "Largest image, decoded from base64")->check(positive());
  cmd->add_option("--max-image-pixels", options.limits.max_image_pixels, "Most pixels of an image (checked before decoding)")
      ->check(positive());
  ServeGuardrails& guard = options.limits.guardrails;
  cmd->add_option("--max-agent-steps", guard.max_steps,
                  "Chat guardrail: answer with the fallback, not the model, once a conversation holds this many "
                  "assistant turns since its last user message (0: no limit)")->check(non_negative());
  cmd->add_option("--max-tool-failures", guard.max_consecutive_failures,
                  "Chat guardrail: answer with the fallback once the last N tool results are errors "
                  "(a JSON object with \"error\"; 0: no limit)")->check(non_negative());
  cmd->add_option("--min-confidence", min_confidence,
                  "Chat guardrail: a reply without tool calls whose mean token log-probability is below this "
                  "abstains (the fallback replaces it; streamed replies then arrive whole at their end)");
  cmd->add_option("--fallback-text", guard.fallback, "The content of a chat choice a guardrail stopped");
  cmd->add_option("--http-threads", options.http_threads, "HTTP threads kept ready (0: 2 × max-sequences + 4)")->check(non_negative());
  cmd->add_option("--max-connections", options.max_connections, "Connections served at once, one thread each")->check(positive());
  cmd->add_option("--keepalive", options.keepalive_seconds,
                  "Seconds a stream may stay silent (a long prompt's prefill) before a keep-alive is sent")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--slot-save-path", options.slot_save_path,
                  "Directory for slot files: POST /slots/{id}?action=save|restore (created if missing)");
  cmd->add_option("--shutdown-grace", options.shutdown_grace_seconds,
                  "Seconds in-flight requests get after SIGINT/SIGTERM before they are cancelled")->check(non_negative());
  add_expert_memory_options(cmd, expert_memory);
  add_mmproj_option(cmd, mmproj);
  cmd->callback([cmd] {
    if (serve_experts_to_rank0(options.model_dir)) return;
    options.context_given = cmd->count("--context") > 0;
    options.load = expert_memory.load_options();
    options.load.mmproj = mmproj;
    options.load.bf16_matrices = dtype == "bf16";
    if (min_confidence) options.limits.guardrails.min_confidence = *min_confidence;
    options.engine.precision = dtype == "bf16" ? Precision::BF16 : Precision::F32;
    options.engine.latent_dtype = cache_dtype == "bf16" ? DType::BF16 : DType::F32;
    options.engine.prefix_cache_bytes = prefix_cache_mb << 20;
    const std::optional<int64_t> budget = memory.empty() ? physical_memory_bytes() / 2 : parse_byte_size(memory);
    HYLA_CHECK(budget && *budget > 0, "--memory {}: give bytes with a unit (e.g. 8GiB)", memory);
    options.engine.memory_budget = *budget;
    options.limits.max_body_bytes = size_t(max_body_kb) << 10;
    if (!api_key_file.empty()) options.api_key = read_key_file(api_key_file);
    HYLA_CHECK(!options.metrics_need_key || !options.api_key.empty(), "--metrics-need-key needs an API key");
    raise_open_file_limit(options.max_connections + 256);  // model files, pipes, the listening socket
    // SIGINT/SIGTERM stop the server from a thread of their own (stopping is not signal-safe).
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    Server server(options);
    const int port = server.bind();
    fmt::print("hyla serve: listening on http://{}:{} (loading {})\n", options.host, port, options.model_dir.string());
    std::thread http([&] { server.listen(); });
    // The first signal drains (new requests 503, in-flight ones get the grace period); a second
    // one stops at once.
    std::thread watcher([&] {
      int signal = 0;
      sigwait(&signals, &signal);
      fmt::print("hyla serve: signal {}, stopping (up to {} s for requests in flight; signal again to stop now)\n",
                 signal, options.shutdown_grace_seconds);
      std::atomic<bool> drained{false};
      std::thread drain([&] {
        server.shutdown();
        drained = true;
      });
      const timespec poll{0, 100'000'000};
      while (!drained)
        if (sigtimedwait(&signals, nullptr, &poll) > 0) server.stop();
      drain.join();
    });
    try {
      server.load();
    } catch (...) {
      pthread_kill(watcher.native_handle(), SIGTERM);
      watcher.join();
      http.join();
      throw;
    }
    fmt::print("hyla serve: model '{}' ready ({} slots × {} tokens); {}\n", server.model_name(),
               server.engine_options().max_sequences, server.engine_options().context, server.memory_summary());
    watcher.join();
    http.join();
  });
}

}  // namespace hyla::cli
