#pragma once
// `hyla serve`: an OpenAI-compatible HTTP server over the inference engine.
//   POST /v1/completions, POST /v1/chat/completions (JSON or SSE streams), GET /v1/models,
//   GET /health (503 while the model loads, then 200), GET /metrics (Prometheus text); the
//   Anthropic Messages and OpenAI Responses APIs; llama-server's /props, /slots and tokenizer
//   routes; and the chat page at /.
// Each HTTP connection runs on a thread of its own (http_threads.h) and waits on the engine, whose
// worker decodes every running request together; a client that disconnects has its sequences
// cancelled. What the server defends against, and what needs a proxy in front: docs/threat-model.md.
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hyla/infer/engine.h"
#include "hyla/serve/api_request.h"

namespace hyla {

struct ServeOptions {
  std::filesystem::path model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;              // 0: any free port
  std::string model_name;       // the id clients name; default: the directory's name
  std::string api_key;          // when set, /v1 requests need "Authorization: Bearer <key>"
  bool metrics_need_key = false;  // and /metrics too
  EngineOptions engine;
  bool context_given = false;   // engine.context was asked for; a default past the model's window is cut to it
  ModelLoadOptions load;        // e.g. the routed experts offloaded (expert_offload.h)
  ServeLimits limits;
  int http_threads = 0;         // threads kept ready; 0: 2 × engine slots + 4
  int max_connections = 1024;   // connections served at once (one thread each); more wait to be accepted
  double shutdown_grace_seconds = 10;  // shutdown(): in-flight requests get this long, then are cancelled
  // A stream silent this long (a long prompt's prefill) gets a keep-alive: an SSE comment, or
  // Anthropic's ping event, so that clients and proxies do not time it out.
  double keepalive_seconds = 10;
  // Browser origins allowed to call the API (CORS), e.g. "http://localhost:3000"; "*" allows any.
  // Empty: no CORS headers, so browsers keep pages of other origins out.
  std::vector<std::string> cors_origins;
  // Where POST /slots/{id}?action=save|restore writes and reads slot files (created at load);
  // empty: slot actions answer 501, as llama-server's without --slot-save-path.
  std::filesystem::path slot_save_path;
};

// Each connection holds a socket: lifts the soft limit on open files (often 1024) to `files`, as far
// as the hard limit allows. Process-wide, so the command calls it, not the server.
void raise_open_file_limit(int64_t files);

class Server {
 public:
  explicit Server(ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();     // listens on the port (answering 503 until load() finishes); returns the port
  void load();    // reads the model and tokenizer and starts the engine
  void listen();  // serves until stop(); call after bind()
  // Stops taking requests (503), gives those in flight the grace period, cancels what is left, and
  // then stops the HTTP server. Safe from any thread but the HTTP ones.
  void shutdown();
  void stop();    // stops at once; requests in flight are cut off
  bool ready() const { return ready_; }
  std::string memory_summary() const;  // the engine's state memory (after load)
  const std::string& model_name() const { return options_.model_name; }
  const EngineOptions& engine_options() const { return options_.engine; }  // as load() settled them

 private:
  struct Impl;
  ServeOptions options_;
  std::atomic<bool> ready_{false};
  std::unique_ptr<Impl> impl_;  // after the two above, which it refers to
};

}  // namespace hyla
