#include "hyla/serve/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "hyla/core/error.h"
#include "hyla/core/threads.h"
#include "hyla/data/tokenizer.h"
#include "hyla/model/model.h"
#include "hyla/serve/api_error.h"
#include "hyla/serve/api_response.h"
#include "hyla/serve/connection_probe.h"
#include "hyla/serve/metrics.h"
#include "hyla/serve/tool_stream.h"

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

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Metrics label: one of the routes, so that random paths cannot grow the label set.
std::string route_label(const std::string& path) {
  for (const char* route : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
    if (path == route) return route;
  return path.rfind("/v1/models/", 0) == 0 ? "/v1/models/{id}" : "other";
}

// One HTTP generation request: its choices in the engine and, when streaming, the text pieces the
// engine thread hands to the HTTP thread.
struct Job {
  ApiRequest request;
  ResponseHeader header;
  ConnectionProbe probe;
  std::atomic<bool> gone{false};  // the client disconnected
  std::mutex mutex;
  std::condition_variable pieces_ready;
  std::deque<std::pair<size_t, std::string>> pieces;  // (choice, text)
  std::vector<std::future<GenerationOutput>> futures;
  std::vector<const std::vector<int32_t>*> prompt_of;  // per choice
};

}  // namespace

struct Server::Impl {
  httplib::Server http;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Engine> engine;
  HttpCounters counters;
  int64_t created = unix_time();

  void submit(const std::shared_ptr<Job>& job);
  json wait_for_response(Job& job);
  bool stream(Job& job, httplib::DataSink& sink);
};

Server::Server(ServeOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  if (options_.model_name.empty())
    options_.model_name = std::filesystem::weakly_canonical(std::filesystem::absolute(options_.model_dir)).filename().string();
  options_.limits.context = options_.engine.context;
  httplib::Server& http = impl_->http;
  const size_t threads = size_t(options_.http_threads > 0 ? options_.http_threads : 2 * options_.engine.max_sequences + 4);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options_.limits.max_body_bytes);
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    impl_->counters.add(route_label(req.path), res.status);
  });
  // cpp-httplib's own rejections (no route, body over the limit, unparsable HTTP) get an
  // OpenAI-shaped body too.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      send_error(res, ApiError(400, fmt::format("the request body exceeds this server's limit of {} bytes",
                                                options_.limits.max_body_bytes),
                               "", "request_too_large"));
    } else if (res.status == 404) {
      send_error(res, ApiError(404, fmt::format("no route for {} {}", req.method, req.path), "", "not_found"));
    } else {
      send_error(res, ApiError(res.status, fmt::format("HTTP {}", res.status)));
    }
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, message, "", "", "server_error"));
  });
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "invalid or missing API key (Authorization: Bearer ...)", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, ready_ ? 200 : 503, {{"status", ready_ ? "ok" : "loading"}});
  });
  const auto model_card = [this] {
    return json{{"id", options_.model_name},       {"object", "model"},
                {"created", impl_->created},       {"owned_by", "hyla"},
                {"max_model_len", options_.engine.context}};
  };
  http.Get("/v1/models", [model_card](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_card()})}});
  });
  http.Get(R"(/v1/models/(.+))", [this, model_card](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] == options_.model_name) return send_json(res, 200, model_card());
    send_error(res, ApiError(404, fmt::format("The model '{}' does not exist", req.matches[1].str()), "model",
                             "model_not_found"));
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineStats stats = ready_ ? impl_->engine->stats() : EngineStats{};  // empty while loading
    res.set_content(prometheus_metrics(stats, impl_->counters, options_.engine.max_sequences),
                    "text/plain; version=0.0.4");
  });
  for (const bool chat : {false, true}) {
    http.Post(chat ? "/v1/chat/completions" : "/v1/completions",
              [this, chat](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!ready_) throw ApiError(503, "the model is still loading", "", "model_loading", "server_error");
        json body;
        try {
          body = json::parse(req.body);
        } catch (const json::exception& e) {
          throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
        }
        auto job = std::make_shared<Job>();
        job->request = chat ? parse_chat_request(body, *impl_->tokenizer, options_.model_name, options_.limits)
                            : parse_completion_request(body, *impl_->tokenizer, options_.model_name, options_.limits);
        job->header = {random_id(chat ? "chatcmpl-" : "cmpl-"),
                       chat ? (job->request.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion",
                       options_.model_name, unix_time()};
        job->probe = ConnectionProbe(req.remote_addr, req.remote_port, req.local_port);
        impl_->submit(job);
        if (!job->request.stream) return send_json(res, 200, impl_->wait_for_response(*job));
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider("text/event-stream", [this, job](size_t, httplib::DataSink& sink) {
          return impl_->stream(*job, sink);
        });
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, ApiError(400, e.what()));
      }
    });
  }
}

Server::~Server() { stop(); }

int Server::bind() {
  const int port = options_.port == 0 ? impl_->http.bind_to_any_port(options_.host)
                                      : (impl_->http.bind_to_port(options_.host, options_.port) ? options_.port : -1);
  HYLA_CHECK(port > 0, "serve: cannot listen on {}:{} (in use, or not an address of this machine)", options_.host,
             options_.port);
  return port;
}

void Server::load() {
  run_on_passing_thread([&] { impl_->model = Model::load(options_.model_dir); });  // leaves the engine the only OpenMP pool
  const std::filesystem::path tokenizer_path = options_.model_dir / "tokenizer.json";
  HYLA_CHECK(std::filesystem::exists(tokenizer_path), "serve: {} has no tokenizer.json", options_.model_dir.string());
  impl_->tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_path));
  impl_->engine = std::make_unique<Engine>(*impl_->model, *impl_->tokenizer, options_.engine);
  ready_ = true;
}

std::string Server::memory_summary() const { return impl_->engine->memory_summary(); }

void Server::listen() { impl_->http.listen_after_bind(); }

void Server::stop() {
  if (impl_->http.is_running()) impl_->http.stop();
}

void Server::Impl::submit(const std::shared_ptr<Job>& job) {
  const ApiRequest& r = job->request;
  try {
    for (const auto& prompt : r.prompts)
      for (int64_t k = 0; k < r.n; ++k) {
        const size_t index = job->prompt_of.size();
        GenerationRequest g = r.generation;
        g.prompt = prompt;
        g.sampling.seed += uint64_t(k);
        // The engine holds the job (through these callbacks) until the request finishes.
        g.is_cancelled = [job] { return job->gone || job->probe.closed(); };
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
    } catch (const std::exception& e) {
      job.gone = true;
      throw ApiError(500, e.what(), "", "", "server_error");
    }
  }
  return job.request.chat ? chat_response(job.header, job.request, choices, *tokenizer)
                          : completion_response(job.header, job.request, choices, *tokenizer);
}

bool Server::Impl::stream(Job& job, httplib::DataSink& sink) {
  const ApiRequest& r = job.request;
  const auto write = [&](const json& event) {
    const std::string line = "data: " + dump(event) + "\n\n";
    if (sink.write(line.data(), line.size())) return true;
    job.gone = true;  // the client went away: the engine cancels its sequences
    return false;
  };
  const size_t n = job.futures.size();
  std::vector<ToolCallStream> tools(n, ToolCallStream(r.prefill));
  std::vector<bool> done(n, false);
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
    for (const auto& [i, text] : pieces) {
      if (!r.chat) {
        if (!write(completion_chunk(job.header, int64_t(i), text, nullptr))) return false;
        continue;
      }
      const std::string content = r.tools_offered ? tools[i].push(text) : text;
      if (!content.empty() && !write(chat_chunk(job.header, int64_t(i), {{"content", content}}, nullptr))) return false;
    }
    for (size_t i : ready) {
      done[i] = true;
      ++finished;
      GenerationOutput out;
      try {
        out = job.futures[i].get();
      } catch (const std::exception& e) {
        if (!write(ApiError(500, e.what(), "", "", "server_error").to_json())) return false;
        continue;
      }
      usage.add(out);
      json last;
      if (r.chat) {
        AssistantReply reply;
        if (r.tools_offered) reply = tools[i].finish();
        if (!reply.content.empty() && !write(chat_chunk(job.header, int64_t(i), {{"content", reply.content}}, nullptr)))
          return false;
        if (!reply.tool_calls.empty() &&
            !write(chat_chunk(job.header, int64_t(i), {{"tool_calls", tool_calls_json(reply.tool_calls, true)}}, nullptr)))
          return false;
        last = chat_chunk(job.header, int64_t(i), json::object(), finish_reason(out, !reply.tool_calls.empty()));
      } else {
        last = completion_chunk(job.header, int64_t(i), "", finish_reason(out, false));
      }
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
  const std::string end = "data: [DONE]\n\n";
  if (!sink.write(end.data(), end.size())) return false;
  sink.done();
  return true;
}

}  // namespace hyla
