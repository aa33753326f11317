#include "hyla/serve/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "hyla/core/error.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/dist/processes.h"
#include "hyla/io/json_fields.h"
#include "hyla/model/model.h"
#include "hyla/serve/anthropic_api.h"
#include "hyla/serve/api_error.h"
#include "hyla/serve/api_response.h"
#include "hyla/serve/connection_probe.h"
#include "hyla/serve/http_threads.h"
#include "hyla/serve/metrics.h"
#include "hyla/serve/responses_api.h"
#include "hyla/serve/slots_api.h"
#include "hyla/serve/web_assets.h"
#include "hyla/data/reply_stream.h"

namespace hyla {

using json = nlohmann::json;

namespace {

// Token pieces may end inside a UTF-8 character (logprobs' token strings): such bytes become U+FFFD
// instead of failing the response.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.to_json()); }

// The Anthropic Messages routes answer errors in Anthropic's shape (anthropic_api.h).
bool anthropic_route(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

void send_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, anthropic_route(req.path) ? anthropic_error(e) : e.to_json());
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Metrics label: one of the routes, so that random paths cannot grow the label set.
std::string route_label(const std::string& path) {
  for (const char* route :
       {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
        "/v1/models", "/health", "/props", "/slots", "/",
        "/metrics", "/tokenize", "/detokenize"})
    if (path == route) return route;
  if (path.rfind("/web/", 0) == 0) return "/web/{file}";
  if (path.rfind("/slots/", 0) == 0) return "/slots/{id}";
  return path.rfind("/v1/models/", 0) == 0 ? "/v1/models/{id}" : "other";
}

// The kernel's queue of connections not yet accepted; cpp-httplib listens with a backlog of 5,
// which drops connections under a burst.
constexpr int kListenBacklog = 4096;

// Compares a presented secret with the key in time that depends only on the key's length.
bool same_secret(std::string_view presented, std::string_view key) {
  unsigned diff = presented.size() != key.size();
  for (size_t i = 0; i < key.size(); ++i) diff |= unsigned(uint8_t(key[i]) ^ uint8_t(i < presented.size() ? presented[i] : 0));
  return diff == 0;
}

// The credentials of "Authorization: Bearer <token>"; the scheme is case-insensitive (RFC 7235).
std::string_view bearer_token(std::string_view header) {
  const size_t space = header.find(' ');
  if (space == std::string_view::npos) return {};
  std::string scheme(header.substr(0, space));
  for (char& c : scheme) c = char(std::tolower(uint8_t(c)));
  if (scheme != "bearer") return {};
  std::string_view token = header.substr(space);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  return token;
}

// A Content-Length header that is a plain non-negative decimal number, or -1.
int64_t parsed_content_length(const std::string& value) {
  if (value.empty() || value.size() > 18) return -1;
  int64_t n = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

// An exception a handler let through: a 500 with its message in the route's API's shape.
void answer_exception(const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
  std::string message = "internal error";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    message = describe_exception(e);
  } catch (...) {
  }
  send_error(req, res, ApiError(500, message, "", "", "server_error"));
}

// A choice cancelled while its client is still there: the server is shutting down.
ApiError cancelled_by_shutdown() {
  return ApiError(503, "the server shut down before the request finished", "", "shutting_down", "server_error");
}

// One HTTP generation request: its choices in the engine and, when streaming, the text pieces the
// engine thread hands to the HTTP thread. It counts as in flight until the last holder (the
// handler, the stream, the engine's callbacks) lets it go.
struct Job {
  explicit Job(std::atomic<int64_t>& in_flight) : in_flight(in_flight) { ++in_flight; }
  ~Job() { --in_flight; }
  std::atomic<int64_t>& in_flight;
  ApiRequest request;
  ResponseHeader header;
  ConnectionProbe probe;
  std::atomic<bool> gone{false};  // the client disconnected
  std::mutex mutex;
  std::condition_variable pieces_ready;
  std::deque<std::pair<size_t, std::string>> pieces;  // (choice, text)
  std::vector<std::future<GenerationOutput>> futures;
  std::vector<const std::vector<int32_t>*> prompt_of;  // per choice
  std::optional<MessageEvents> message_events;  // /v1/messages streams: the chat chunks in Anthropic's events
  std::optional<ResponseEvents> response_events;  // /v1/responses streams: the chat chunks as Response events
  std::string response_id;                        // /v1/responses with store: where its conversation is kept
  json conversation;                              // … and the conversation before the reply
};

// The request shapes generation is asked in.
enum class Api : uint8_t { Completions, Chat, Messages, Responses };

}  // namespace

struct Server::Impl {
  Impl(const ServeOptions& options, const std::atomic<bool>& ready) : options(options), ready(ready) {}

  const ServeOptions& options;      // the server's: its constructor and load() complete them
  const std::atomic<bool>& ready;   // the model is loaded
  httplib::Server http;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;
  ServerCounters counters;
  int64_t created = unix_time();
  int listen_fd = -1;
  std::atomic<int64_t> in_flight{0};       // generation requests not yet answered
  std::atomic<bool> draining{false};       // shutdown(): new requests get 503
  // The conversations previous_response_id continues: an hour, 64 MiB of JSON at most.
  ResponseStore response_store{std::chrono::hours(1), size_t(64) << 20};
  std::atomic<bool> cancel_all{false};     // shutdown(): the grace period is over
  std::atomic<bool> processes_failed{false};  // a process of the job stopped answering: 503s, then the job ends
  // stop() before listen() has started (a model that fails to load at once) must still end it.
  std::atomic<bool> stop_requested{false}, listen_entered{false}, listen_returned{false};

  httplib::Server::HandlerResponse screen(const httplib::Request& req, httplib::Response& res) const;
  bool answer_cors(const httplib::Request& req, httplib::Response& res) const;
  bool refuse_content_length(const httplib::Request& req, httplib::Response& res) const;
  bool refuse_api_key(const httplib::Request& req, httplib::Response& res) const;
  void answer_rejection(const httplib::Request& req, httplib::Response& res) const;

  void health(const httplib::Request& req, httplib::Response& res) const;
  void list_models(const httplib::Request& req, httplib::Response& res) const;
  void describe_model(const httplib::Request& req, httplib::Response& res) const;
  void metrics(const httplib::Request& req, httplib::Response& res) const;
  void props(const httplib::Request& req, httplib::Response& res) const;
  void list_slots(const httplib::Request& req, httplib::Response& res) const;
  void slot_action(const httplib::Request& req, httplib::Response& res) const;
  void page(const httplib::Request& req, httplib::Response& res) const;
  void tokenize(const httplib::Request& req, httplib::Response& res) const;
  void detokenize(const httplib::Request& req, httplib::Response& res) const;
  void completions(const httplib::Request& req, httplib::Response& res) { generate(req, res, Api::Completions); }
  void chat_completions(const httplib::Request& req, httplib::Response& res) { generate(req, res, Api::Chat); }
  void messages(const httplib::Request& req, httplib::Response& res) { generate(req, res, Api::Messages); }
  void responses(const httplib::Request& req, httplib::Response& res) { generate(req, res, Api::Responses); }
  void count_message_tokens(const httplib::Request& req, httplib::Response& res) const;

  // A process of the job stopped answering (ProcessFailure): every request gets a 503 from now
  // on, and after a second, for the answers to leave, the job ends with the failure's line.
  ApiError process_failure(const ProcessFailure& e);
  json model_card() const;
  void answer_tokenizer_request(const httplib::Request& req, httplib::Response& res,
                                const std::function<json(const json&)>& answer) const;
  void generate(const httplib::Request& req, httplib::Response& res, Api api);
  void submit(const std::shared_ptr<Job>& job);
  json wait_for_response(Job& job);
  bool stream(Job& job, httplib::DataSink& sink);
};

void raise_open_file_limit(int64_t files) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= rlim_t(files)) return;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? rlim_t(files) : std::min(rlim_t(files), limit.rlim_max);
  setrlimit(RLIMIT_NOFILE, &limit);
}

Server::Server(ServeOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>(options_, ready_)) {
  if (options_.model_name.empty())
    options_.model_name = std::filesystem::weakly_canonical(std::filesystem::absolute(options_.model_dir)).filename().string();
  options_.limits.context = options_.engine.context;
  Impl* impl = impl_.get();
  httplib::Server& http = impl->http;
  const size_t threads = size_t(options_.http_threads > 0 ? options_.http_threads : 2 * options_.engine.max_sequences + 4);
  const size_t limit = size_t(std::max(options_.max_connections, 1));
  http.new_task_queue = [threads, limit] { return new ElasticThreadPool(std::min(threads, limit), limit); };
  // cpp-httplib's default sets SO_REUSEPORT, with which a second server on the same port starts
  // cleanly and the kernel splits the traffic between the two. SO_REUSEADDR alone still allows a
  // restart while old connections linger in TIME_WAIT. The socket is remembered to widen the backlog.
  http.set_socket_options([impl](int fd) {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    impl->listen_fd = fd;
  });
  http.set_payload_max_length(options_.limits.max_body_bytes);
  http.set_logger([impl](const httplib::Request& req, const httplib::Response& res) {
    impl->counters.add_response(route_label(req.path), res.status);
  });
  http.set_exception_handler(answer_exception);
  const auto to = [impl](auto handler) {
    return [impl, handler](const httplib::Request& req, httplib::Response& res) { return (impl->*handler)(req, res); };
  };
  http.set_error_handler(to(&Impl::answer_rejection));
  http.set_pre_routing_handler(to(&Impl::screen));
  http.Get("/health", to(&Impl::health));
  http.Get("/v1/models", to(&Impl::list_models));
  http.Get(R"(/v1/models/(.+))", to(&Impl::describe_model));
  http.Get("/metrics", to(&Impl::metrics));
  http.Get("/props", to(&Impl::props));
  http.Get("/slots", to(&Impl::list_slots));
  http.Post(R"(/slots/([^/]*))", to(&Impl::slot_action));
  http.Get("/", to(&Impl::page));
  http.Get(R"(/web/([A-Za-z0-9_.-]+))", to(&Impl::page));
  http.Post("/tokenize", to(&Impl::tokenize));
  http.Post("/detokenize", to(&Impl::detokenize));
  http.Post("/v1/completions", to(&Impl::completions));
  http.Post("/v1/chat/completions", to(&Impl::chat_completions));
  http.Post("/v1/messages", to(&Impl::messages));
  http.Post("/v1/messages/count_tokens", to(&Impl::count_message_tokens));
  http.Post("/v1/responses", to(&Impl::responses));
}

// Runs before cpp-httplib reads a body, so a bad Content-Length is refused without waiting for it.
httplib::Server::HandlerResponse Server::Impl::screen(const httplib::Request& req, httplib::Response& res) const {
  const bool answered = answer_cors(req, res) || refuse_content_length(req, res) || refuse_api_key(req, res);
  return answered ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
}

// CORS: an allowed Origin is echoed on every response; its preflight (OPTIONS) is answered here,
// before the key check, since browsers send preflights without credentials.
bool Server::Impl::answer_cors(const httplib::Request& req, httplib::Response& res) const {
  const std::string origin = req.get_header_value("Origin");
  const bool allowed = !origin.empty() && std::any_of(options.cors_origins.begin(), options.cors_origins.end(),
                                                      [&](const std::string& o) { return o == "*" || o == origin; });
  if (allowed) {
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
  }
  if (req.method != "OPTIONS" || !req.has_header("Access-Control-Request-Method")) return false;
  if (!allowed) {
    send_error(res, ApiError(403, fmt::format("origin '{}' may not call this server (serve --cors-origin)", origin),
                             "", "origin_not_allowed"));
    return true;
  }
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
  res.set_header("Access-Control-Max-Age", "600");
  return true;
}

bool Server::Impl::refuse_content_length(const httplib::Request& req, httplib::Response& res) const {
  if (!req.has_header("Content-Length")) return false;
  const std::string value = req.get_header_value("Content-Length");
  const int64_t length = parsed_content_length(value);
  // A body over the limit but within kDrainedBodyBytes is left to cpp-httplib, which reads and drops
  // it before its 413 (answer_rejection's 400): a client that writes its whole request before
  // reading the answer (the SDKs do) hears why, where a closed socket would fail its write.
  constexpr int64_t kDrainedBodyBytes = int64_t(64) << 20;
  if (length >= 0 && uint64_t(length) > options.limits.max_body_bytes && length <= kDrainedBodyBytes) return false;
  // The body is left unread: the connection cannot carry another request.
  if (length < 0 || uint64_t(length) > options.limits.max_body_bytes) res.set_header("Connection", "close");
  if (length < 0) {
    send_error(req, res, ApiError(400, fmt::format("Content-Length '{}' is not a non-negative integer", value), "",
                                  "invalid_content_length"));
    return true;
  }
  if (uint64_t(length) > options.limits.max_body_bytes) {
    send_error(req, res, ApiError(400, fmt::format("the request body ({} bytes) exceeds this server's limit of {} bytes",
                                                   length, options.limits.max_body_bytes),
                                  "", "request_too_large"));
    return true;
  }
  return false;
}

bool Server::Impl::refuse_api_key(const httplib::Request& req, httplib::Response& res) const {
  const bool needs_key = !options.api_key.empty() &&
                         (req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize" ||
                          req.path == "/props" || req.path == "/slots" || req.path.rfind("/slots/", 0) == 0 ||
                          (options.metrics_need_key && req.path == "/metrics"));
  // OpenAI's clients send the key as a bearer token, Anthropic's as x-api-key.
  if (!needs_key || same_secret(bearer_token(req.get_header_value("Authorization")), options.api_key) ||
      (req.has_header("x-api-key") && same_secret(req.get_header_value("x-api-key"), options.api_key)))
    return false;
  send_error(req, res, ApiError(401, "invalid or missing API key (Authorization: Bearer ..., or x-api-key)", "",
                                "invalid_api_key"));
  return true;
}

// cpp-httplib's own rejections (no route, body over the limit, unparsable HTTP) get an
// OpenAI-shaped body too.
void Server::Impl::answer_rejection(const httplib::Request& req, httplib::Response& res) const {
  if (!res.body.empty()) return;
  const int64_t declared = parsed_content_length(req.get_header_value("Content-Length"));
  if (res.status == 413) {
    send_error(req, res, ApiError(400, fmt::format("the request body exceeds this server's limit of {} bytes",
                                              options.limits.max_body_bytes),
                             "", "request_too_large"));
  } else if (res.status == 400 && declared > int64_t(req.body.size())) {
    send_error(req, res, ApiError(400, fmt::format("the request body ended after {} of the {} bytes its Content-Length "
                                              "announced", req.body.size(), declared),
                             "", "incomplete_body"));
  } else if (res.status == 404) {
    send_error(req, res, ApiError(404, fmt::format("no route for {} {}", req.method, req.path), "", "not_found"));
  } else {
    send_error(req, res, ApiError(res.status, fmt::format("HTTP {}", res.status)));
  }
}

ApiError Server::Impl::process_failure(const ProcessFailure& e) {
  if (!processes_failed.exchange(true)) {
    const std::string line = e.what();
    std::thread([line] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      fmt::print(stderr, "hyla serve: {}\n", line);
      abort_processes(1);
    }).detach();
  }
  return ApiError(503, e.what(), "", "process_failure", "server_error");
}

// A draining server is unhealthy, so that a load balancer stops sending it requests.
void Server::Impl::health(const httplib::Request&, httplib::Response& res) const {
  const char* status = processes_failed ? "process_failure" : draining ? "shutting_down" : ready ? "ok" : "loading";
  send_json(res, status == std::string_view("ok") ? 200 : 503, {{"status", status}});
}

json Server::Impl::model_card() const {
  return json{{"id", options.model_name},       {"object", "model"},
              {"created", created},             {"owned_by", "hyla"},
              {"max_model_len", options.engine.context}};
}

void Server::Impl::list_models(const httplib::Request&, httplib::Response& res) const {
  send_json(res, 200, {{"object", "list"}, {"data", json::array({model_card()})}});
}

void Server::Impl::describe_model(const httplib::Request& req, httplib::Response& res) const {
  if (req.matches[1] == options.model_name) return send_json(res, 200, model_card());
  send_error(res, ApiError(404, fmt::format("The model '{}' does not exist", req.matches[1].str()), "model",
                           "model_not_found"));
}

void Server::Impl::metrics(const httplib::Request&, httplib::Response& res) const {
  const EngineStats stats = ready ? engine->stats() : EngineStats{};  // empty while loading
  const ExpertOffload* offload = ready ? model->expert_offload() : nullptr;
  res.set_content(prometheus_metrics(stats, counters, options.engine.max_sequences,
                                     offload ? std::optional(offload->stats()) : std::nullopt),
                  "text/plain; version=0.0.4");
}

// The chat page (web/, serve/web_assets.h) at / and its files at /web/NAME. Its policy lets it run
// only this server's scripts and styles and talk only to this server.
void Server::Impl::page(const httplib::Request& req, httplib::Response& res) const {
  const std::string name = req.matches.size() > 1 ? req.matches[1].str() : "index.html";
  for (const WebAsset& asset : web_assets()) {
    if (name != asset.name) continue;
    const std::string_view n(asset.name);
    const char* type = n.ends_with(".html") ? "text/html; charset=utf-8"
                       : n.ends_with(".js") ? "text/javascript; charset=utf-8"
                       : n.ends_with(".css") ? "text/css; charset=utf-8"
                                             : "application/octet-stream";
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
                   "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(reinterpret_cast<const char*>(asset.data), asset.size, type);
    return;
  }
  send_error(req, res, ApiError(404, fmt::format("no page file '{}'", name), "", "not_found"));
}

// llama-server's /props, which chat UIs read: the model, its context, slots, chat format and
// modalities, and the sampling defaults a request without those fields gets.
void Server::Impl::props(const httplib::Request&, httplib::Response& res) const {
  if (!ready) return send_error(res, ApiError(503, "the model is still loading", "", "model_loading", "server_error"));
  send_json(res, 200,
            {{"model_alias", options.model_name},
             {"model_path", options.model_dir.string()},
             {"total_slots", options.engine.max_sequences},
             {"chat_template", std::string(to_string(ChatTemplate(*tokenizer).format()))},
             {"modalities", {{"vision", model->config().vision.enabled}, {"audio", false}}},
             {"default_generation_settings",
              {{"n_ctx", options.engine.context},
               {"params", {{"temperature", 1.0}, {"top_p", 1.0}, {"top_k", 0}, {"min_p", 0.0},
                           {"n_predict", options.limits.max_tokens}}}}},
             {"build_info", fmt::format("hyla {}", HYLA_VERSION)}});
}

void Server::Impl::list_slots(const httplib::Request& req, httplib::Response& res) const {
  try {
    if (!ready) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
    const auto slots =
        engine->between_steps(std::function<std::vector<Scheduler::SlotInfo>(Scheduler&)>(&Scheduler::slots)).get();
    if (req.has_param("fail_on_no_slot") && std::ranges::all_of(slots, &Scheduler::SlotInfo::processing))
      throw ApiError(503, "no slot available", "", "", "unavailable_error");
    send_json(res, 200, slots_listing(slots, options.engine.context));
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const std::exception& e) {  // the engine stopped
    send_error(res, ApiError(503, describe_exception(e), "", "", "server_error"));
  }
}

void Server::Impl::slot_action(const httplib::Request& req, httplib::Response& res) const {
  try {
    if (!ready) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
    if (options.slot_save_path.empty())
      throw ApiError(501, "this server does not support slot actions: start it with --slot-save-path", "", "",
                     "not_supported_error");
    const SlotAction action = parse_slot_action(req.matches[1].str(), req.get_param_value("action"), req.body,
                                                options.slot_save_path, int(options.engine.max_sequences));
    send_json(res, 200,
              engine->between_steps(std::function<json(Scheduler&)>([&action](Scheduler& scheduler) {
                      return run_slot_action(scheduler, action);
                    }), action.slot).get());
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const std::exception& e) {  // a save that failed to write, or the engine stopped
    send_error(res, ApiError(500, describe_exception(e), "", "", "server_error"));
  }
}

// llama.cpp's and vLLM's tokenizer endpoints, so that clients count and inspect tokens with the
// served model's tokenizer: POST /tokenize {"content" | "prompt": text, "parse_special": true,
// "with_pieces": false} → {"tokens", "count", "max_model_len"}; POST /detokenize {"tokens": [ids]}
// → {"content"}.
void Server::Impl::answer_tokenizer_request(const httplib::Request& req, httplib::Response& res,
                                            const std::function<json(const json&)>& answer) const {
  try {
    if (!ready) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
    const json body = parse_json(req.body, "the request body");
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    send_json(res, 200, answer(body));
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const Error& e) {
    send_error(res, ApiError(400, e.what()));
  }
}

void Server::Impl::tokenize(const httplib::Request& req, httplib::Response& res) const {
  answer_tokenizer_request(req, res, [this](const json& body) {
    const char* field = body.contains("content") ? "content" : "prompt";
    if (!body.contains(field) || !body[field].is_string())
      throw ApiError(400, "'content' (or 'prompt') must be a string", "content");
    for (const char* flag : {"parse_special", "with_pieces"})
      if (body.contains(flag) && !body[flag].is_boolean())
        throw ApiError(400, fmt::format("'{}' must be true or false", flag), flag);
    const bool special = body.value("parse_special", true), pieces = body.value("with_pieces", false);
    const std::vector<int32_t> ids = tokenizer->encode(body[field].get<std::string>(), special);
    json tokens = json::array();
    for (int32_t id : ids) {
      if (!pieces) tokens.push_back(id);
      else tokens.push_back({{"id", id}, {"piece", std::string(tokenizer->decode_token(id))}});
    }
    return json{{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", options.engine.context}};
  });
}

void Server::Impl::detokenize(const httplib::Request& req, httplib::Response& res) const {
  answer_tokenizer_request(req, res, [this](const json& body) {
    if (!body.contains("tokens") || !body["tokens"].is_array())
      throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const json& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tokenizer->vocab_size())
        throw ApiError(400, fmt::format("'tokens' holds {}, not a token id in [0, {})", t.dump(),
                                        tokenizer->vocab_size()), "tokens");
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    return json{{"content", tokenizer->decode(ids)}};
  });
}

// POST /v1/messages/count_tokens: the prompt's length as the Messages request would be read.
void Server::Impl::count_message_tokens(const httplib::Request& req, httplib::Response& res) const {
  try {
    if (!ready) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
    json body = parse_json(req.body, "the request body");
    if (body.is_object() && !body.contains("max_tokens")) body["max_tokens"] = 1;  // not part of a count
    const ApiRequest r = parse_chat_request(chat_body_from_messages(body), *tokenizer, options.model_name, options.limits);
    send_json(res, 200, {{"input_tokens", r.prompts[0].size()}});
  } catch (const ApiError& e) {
    send_error(req, res, e);
  } catch (const Error& e) {
    send_error(req, res, ApiError(400, e.what()));
  }
}

// POST /v1/completions, /v1/chat/completions, /v1/messages and /v1/responses: a JSON reply, or an
// SSE stream.
void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, Api api) {
  auto job = std::make_shared<Job>(in_flight);
  job->probe = ConnectionProbe(req.remote_addr, req.remote_port, req.local_port);
  const bool chat = api != Api::Completions;
  int status = 200;
  json reply;
  try {
    if (!ready) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
    if (draining) throw ApiError(503, "the server is shutting down", "", "shutting_down", "server_error");
    if (processes_failed)
      throw ApiError(503, "a process of this job stopped answering; the job is ending", "", "process_failure",
                     "server_error");
    json body = parse_json(req.body, "the request body");
    std::optional<ResponseHeaderFields> response_fields;
    if (api == Api::Messages) body = chat_body_from_messages(body);
    if (api == Api::Responses) {
      json history = json::array();
      if (body.is_object() && body.contains("previous_response_id") && !body["previous_response_id"].is_null()) {
        const json& previous = body["previous_response_id"];
        std::optional<json> kept = previous.is_string() ? response_store.get(previous.get<std::string>()) : std::nullopt;
        if (!kept)
          throw ApiError(400, fmt::format("Previous response with id {} not found (responses are kept for an hour "
                                          "when stored)", previous.dump()), "previous_response_id");
        history = std::move(*kept);
      }
      ResponsesRequest read = chat_body_from_responses(body, history);
      response_fields = response_header(body, random_id("resp_"), unix_time(), options.model_name);
      if (body.value("store", json(true)) != false) job->response_id = response_fields->id;
      job->conversation = std::move(read.conversation);
      body = std::move(read.chat);
    }
    job->request = chat ? parse_chat_request(body, *tokenizer, options.model_name, options.limits)
                        : parse_completion_request(body, *tokenizer, options.model_name, options.limits);
    job->header = {random_id(chat ? "chatcmpl-" : "cmpl-"),
                   chat ? (job->request.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion",
                   options.model_name, unix_time()};
    if (api == Api::Messages && job->request.stream)
      job->message_events.emplace(random_id("msg_"), options.model_name, int64_t(job->request.prompts[0].size()));
    if (api == Api::Responses && job->request.stream) job->response_events.emplace(*response_fields);
    // An interim response may go out only before the final one starts: not while streaming.
    job->probe.allow_interim(!job->request.stream && req.version == "HTTP/1.1");
    submit(job);
    if (job->request.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider("text/event-stream", [this, job](size_t, httplib::DataSink& sink) {
        return stream(*job, sink);
      });
      return;
    }
    reply = wait_for_response(*job);
    if (api == Api::Messages) reply = message_from_chat_response(reply, random_id("msg_"));
    if (api == Api::Responses) {
      if (!job->response_id.empty()) {
        job->conversation.push_back(reply["choices"][0]["message"]);
        response_store.put(job->response_id, std::move(job->conversation));
      }
      reply = response_from_chat(reply, *response_fields);
    }
  } catch (const ApiError& e) {
    status = e.status, reply = api == Api::Messages ? anthropic_error(e) : e.to_json();
  } catch (const Error& e) {
    const ApiError bad(400, e.what());
    status = 400, reply = api == Api::Messages ? anthropic_error(bad) : bad.to_json();
  }
  res.status = status;  // counted by the logger however it is sent
  if (job->probe.half_closed() && job->probe.send_reply(status, "application/json", dump(reply))) return;
  send_json(res, status, reply);
}

Server::~Server() { stop(); }

int Server::bind() {
  const int port = options_.port == 0 ? impl_->http.bind_to_any_port(options_.host)
                                      : (impl_->http.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  HYLA_CHECK(port > 0, "serve: cannot listen on {}:{} (in use, or not an address of this machine)", options_.host,
             options_.port);
  HYLA_ASSERT(impl_->listen_fd >= 0);
  ::listen(impl_->listen_fd, kListenBacklog);  // a second listen() only widens the queue
  return port;
}

void Server::load() {
  impl_->model = load_model_for_engine(options_.model_dir, options_.load);
  options_.engine.context = fit_default_context(*impl_->model, options_.engine.context, options_.context_given, "hyla serve");
  options_.limits.context = options_.engine.context;
  options_.limits.vision = impl_->model->config().vision;  // before ready_: no request reads limits until then
  HYLA_CHECK(std::filesystem::is_regular_file(options_.model_dir) ||
                 std::filesystem::exists(options_.model_dir / "tokenizer.json") ||
                 std::filesystem::exists(options_.model_dir / "tiktoken.model"),
             "serve: {} has no tokenizer.json (or a Kimi checkpoint's tiktoken.model)", options_.model_dir.string());
  impl_->tokenizer = std::make_unique<Tokenizer>(load_model_tokenizer(options_.model_dir));
  if (!options_.slot_save_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.slot_save_path, ec);
    HYLA_CHECK(std::filesystem::is_directory(options_.slot_save_path), "serve: --slot-save-path {}: not a directory{}",
               options_.slot_save_path.string(), ec ? " (" + ec.message() + ")" : "");
  }
  impl_->engine = std::make_unique<Engine>(*impl_->model, *impl_->tokenizer, options_.engine);
  ready_ = true;
}

std::string Server::memory_summary() const { return impl_->engine->memory_summary(); }

void Server::listen() {
  impl_->listen_entered = true;
  if (!impl_->stop_requested) impl_->http.listen_after_bind();
  impl_->listen_returned = true;
}

void Server::shutdown() {
  impl_->draining = true;
  using clock = std::chrono::steady_clock;
  const auto wait_until_idle = [&](clock::time_point deadline) {
    while (impl_->in_flight > 0 && clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  wait_until_idle(clock::now() + std::chrono::duration_cast<clock::duration>(
                                     std::chrono::duration<double>(options_.shutdown_grace_seconds)));
  if (impl_->in_flight > 0) {
    fmt::print("hyla serve: cancelling {} request(s) still running after the {} s grace period\n",
               impl_->in_flight.load(), options_.shutdown_grace_seconds);
    impl_->cancel_all = true;
    wait_until_idle(clock::now() + std::chrono::seconds(5));  // answers go out: 503 or the stream's error
  }
  stop();
}

void Server::stop() {
  impl_->draining = true;
  impl_->cancel_all = true;  // the HTTP threads' last requests end now, so that stopping can join them
  impl_->stop_requested = true;
  // A listen() that has begun but not yet started its loop would miss the stop: wait for its loop.
  while (impl_->listen_entered && !impl_->listen_returned && !impl_->http.is_running()) std::this_thread::yield();
  if (impl_->http.is_running()) impl_->http.stop();
}

void Server::Impl::submit(const std::shared_ptr<Job>& job) {
  const ApiRequest& r = job->request;
  if (r.stopped) {  // a guardrail answers: nothing is generated
    for (const auto& prompt : r.prompts)
      for (int64_t k = 0; k < r.n; ++k) {
        std::promise<GenerationOutput> answered;
        GenerationOutput out;
        out.prompt_tokens = int64_t(prompt.size());
        answered.set_value(std::move(out));
        job->prompt_of.push_back(&prompt);
        job->futures.push_back(answered.get_future());
      }
    return;
  }
  try {
    for (const auto& prompt : r.prompts)
      for (int64_t k = 0; k < r.n; ++k) {
        const size_t index = job->prompt_of.size();
        GenerationRequest g = r.generation;
        g.prompt = prompt;
        g.sampling.seed += uint64_t(k);
        // The engine holds the job (through these callbacks) until the request finishes.
        g.is_cancelled = [this, job] { return cancel_all || job->gone || job->probe.closed(); };
        if (r.stream)
          g.on_text = [job, index](std::string_view text) {
            {
              std::lock_guard<std::mutex> lock(job->mutex);
              job->pieces.emplace_back(index, std::string(text));
            }
            job->pieces_ready.notify_one();
            return !job->gone;
          };
        job->prompt_of.push_back(&prompt);
        job->futures.push_back(engine->submit(std::move(g)));
      }
  } catch (...) {
    job->gone = true;  // cancels the choices already submitted
    throw;
  }
}

json Server::Impl::wait_for_response(Job& job) {
  std::vector<FinishedChoice> choices;
  for (size_t i = 0; i < job.futures.size(); ++i) {
    try {
      choices.push_back({int64_t(i), job.prompt_of[i], job.futures[i].get()});
    } catch (const ProcessFailure& e) {
      job.gone = true;
      throw process_failure(e);
    } catch (const std::exception& e) {
      job.gone = true;
      throw ApiError(500, describe_exception(e), "", "", "server_error");
    }
    if (choices.back().output.finish_reason == FinishReason::Cancelled) throw cancelled_by_shutdown();
  }
  if (!job.request.chat) return completion_response(job.header, job.request, choices, *tokenizer);
  json response = chat_response(job.header, job.request, choices, *tokenizer);
  for (const json& choice : response["choices"])
    if (choice.contains("guardrail")) counters.add_guardrail(choice["guardrail"]["status"].get<std::string>());
  return response;
}

bool Server::Impl::stream(Job& job, httplib::DataSink& sink) {
  const ApiRequest& r = job.request;
  auto last_write = std::chrono::steady_clock::now();
  const auto keep_alive = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_write).count() < options.keepalive_seconds) return true;
    last_write = now;
    const std::string line = job.message_events ? "event: ping\ndata: {\"type\": \"ping\"}\n\n" : ": keep-alive\n\n";
    if (sink.write(line.data(), line.size())) return true;
    job.gone = true;
    return false;
  };
  const auto write = [&](const json& event) {
    last_write = std::chrono::steady_clock::now();
    const std::string line = job.message_events    ? job.message_events->push(event)
                             : job.response_events ? job.response_events->push(event)
                                                   : "data: " + dump(event) + "\n\n";
    if (line.empty() || sink.write(line.data(), line.size())) return true;
    job.gone = true;  // the client went away: the engine cancels its sequences
    return false;
  };
  const size_t n = job.futures.size();
  const ChatTemplate chat_template(*tokenizer);
  std::vector<ReplyStream> replies(n, ReplyStream(chat_template, r.chat_options, r.prefill));
  // A reply the confidence guardrail may replace is held until it is judged, at its end.
  const bool hold = r.chat && r.guardrails.judges_confidence();
  std::vector<bool> done(n, false);
  // A call's delta in OpenAI's form: the call's id, type and name when it opens, then its
  // arguments as they are written.
  const auto write_call = [&](size_t i, const ReplyStream::CallDelta& call) {
    json entry = {{"index", call.index}, {"function", {{"arguments", call.arguments}}}};
    if (!call.name.empty()) {
      entry["id"] = random_id("call_");
      entry["type"] = "function";
      entry["function"]["name"] = call.name;
    }
    return write(chat_chunk(job.header, int64_t(i), {{"tool_calls", json::array({entry})}}, nullptr));
  };
  for (size_t i = 0; i < n; ++i) {
    if (r.chat && !write(chat_chunk(job.header, int64_t(i), {{"role", "assistant"}, {"content", ""}}, nullptr)))
      return false;
    if (!r.chat && r.echo && !write(completion_chunk(job.header, int64_t(i), tokenizer->decode(*job.prompt_of[i]), nullptr)))
      return false;
  }
  Usage usage;
  size_t finished = 0;
  while (finished < n) {
    std::deque<std::pair<size_t, std::string>> pieces;
    std::vector<size_t> ready;
    {
      std::unique_lock<std::mutex> lock(job.mutex);
      job.pieces_ready.wait_for(lock, std::chrono::milliseconds(10), [&] { return !job.pieces.empty(); });
      // A request's text is queued before its future is fulfilled, so a choice seen finished here
      // has all its pieces in this batch.
      for (size_t i = 0; i < n; ++i)
        if (!done[i] && job.futures[i].wait_for(std::chrono::seconds(0)) == std::future_status::ready) ready.push_back(i);
      pieces.swap(job.pieces);
    }
    if (pieces.empty() && ready.empty() && !keep_alive()) return false;
    for (const auto& [i, text] : pieces) {
      if (!r.chat) {
        if (!write(completion_chunk(job.header, int64_t(i), text, nullptr))) return false;
        continue;
      }
      if (hold) continue;
      const ReplyStream::Delta delta = replies[i].push(text);
      if (!delta.reasoning.empty() &&
          !write(chat_chunk(job.header, int64_t(i), {{"reasoning_content", delta.reasoning}}, nullptr)))
        return false;
      if (!delta.content.empty() && !write(chat_chunk(job.header, int64_t(i), {{"content", delta.content}}, nullptr)))
        return false;
      for (const ReplyStream::CallDelta& call : delta.calls)
        if (!write_call(i, call)) return false;
    }
    for (size_t i : ready) {
      done[i] = true;
      ++finished;
      GenerationOutput out;
      try {
        out = job.futures[i].get();
      } catch (const ProcessFailure& e) {
        write(process_failure(e).to_json());
        return false;
      } catch (const std::exception& e) {
        if (!write(ApiError(500, describe_exception(e), "", "", "server_error").to_json())) return false;
        continue;
      }
      if (out.finish_reason == FinishReason::Cancelled) {
        write(cancelled_by_shutdown().to_json());
        return false;
      }
      usage.add(out);
      json last;
      if (r.chat) {
        // What has not been streamed yet (all of a held reply, judged whole).
        ReplyStream::Finish unsent;
        if (hold) {
          unsent.reply = chat_template.parse_reply(r.prefill + out.text, r.chat_options);
          for (size_t k = 0; k < unsent.reply.tool_calls.size(); ++k)
            unsent.calls.push_back({k, unsent.reply.tool_calls[k].name, unsent.reply.tool_calls[k].arguments});
        } else {
          unsent = replies[i].finish();
        }
        const auto [reply, guardrail] = chat_reply(r, out, std::move(unsent.reply));
        if (!reply.reasoning.empty() &&
            !write(chat_chunk(job.header, int64_t(i), {{"reasoning_content", reply.reasoning}}, nullptr)))
          return false;
        if (!reply.content.empty() && !write(chat_chunk(job.header, int64_t(i), {{"content", reply.content}}, nullptr)))
          return false;
        if (!guardrail)
          for (const ReplyStream::CallDelta& call : unsent.calls)
            if (!write_call(i, call)) return false;
        last = chat_chunk(job.header, int64_t(i), json::object(),
                          guardrail ? "stop" : finish_reason(out, !reply.tool_calls.empty()));
        if (guardrail) {
          last["choices"][0]["guardrail"] = guardrail->to_json();
          counters.add_guardrail(guardrail->status);
        }
      } else {
        last = completion_chunk(job.header, int64_t(i), "", finish_reason(out, false));
      }
      last["choices"][0]["stop_reason"] = stop_reason(out);
      if (finished == n) last["usage"] = usage.to_json();  // every response carries usage
      if (!write(last)) return false;
    }
  }
  if (r.include_usage) {
    json chunk = job.header.to_json();
    chunk["choices"] = json::array();
    chunk["usage"] = usage.to_json();
    if (!write(chunk)) return false;
  }
  if (job.response_events && !job.response_id.empty()) {
    job.conversation.push_back(job.response_events->assistant_message());
    response_store.put(job.response_id, std::move(job.conversation));
  }
  const std::string end = job.message_events || job.response_events ? "" : "data: [DONE]\n\n";
  if (!end.empty() && !sink.write(end.data(), end.size())) return false;
  sink.done();
  return true;
}

}  // namespace hyla
