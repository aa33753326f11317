#include "hyla/serve/metrics.h"

#include <fmt/format.h>

namespace hyla {

void HttpCounters::add(const std::string& path, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[{path, status}];
}

std::map<std::pair<std::string, int>, int64_t> HttpCounters::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

namespace {

void counter(std::string& out, const char* name, const char* help, int64_t value) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} counter\n{0} {2}\n", name, help, value);
}

void gauge(std::string& out, const char* name, const char* help, int64_t value) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} gauge\n{0} {2}\n", name, help, value);
}

void histogram(std::string& out, const char* name, const char* help, const LatencyHistogram& h) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
  for (size_t i = 0; i < h.bounds.size(); ++i)
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], h.cumulative[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.cumulative.back(), name, h.sum, name,
                     h.total);
}

}  // namespace

std::string prometheus_metrics(const EngineStats& s, const HttpCounters& http, int64_t slots) {
  std::string out;
  counter(out, "hyla_requests_total", "Generation requests submitted to the engine.", s.requests);
  out += "# HELP hyla_requests_finished_total Generation requests finished, by reason.\n"
         "# TYPE hyla_requests_finished_total counter\n";
  for (FinishReason reason : kFinishReasons)
    out += fmt::format("hyla_requests_finished_total{{reason=\"{}\"}} {}\n", to_string(reason), s.finished[size_t(reason)]);
  counter(out, "hyla_prompt_tokens_total", "Prompt tokens received.", s.prompt_tokens);
  counter(out, "hyla_prompt_tokens_cached_total", "Prompt tokens restored from the prompt-state cache.", s.cached_prompt_tokens);
  counter(out, "hyla_generation_tokens_total", "Tokens generated.", s.generated_tokens);
  histogram(out, "hyla_time_to_first_token_seconds", "Time from submission to the first generated token.", s.ttft);
  histogram(out, "hyla_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", s.itl);
  gauge(out, "hyla_requests_running", "Requests holding a sequence slot.", s.running);
  gauge(out, "hyla_requests_waiting", "Requests queued for a slot.", s.waiting);
  gauge(out, "hyla_sequence_slots", "Sequences decoded together at most.", slots);
  out += "# HELP hyla_http_responses_total HTTP responses, by path and status.\n# TYPE hyla_http_responses_total counter\n";
  for (const auto& [key, count] : http.snapshot())
    out += fmt::format("hyla_http_responses_total{{path=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
  return out;
}

}  // namespace hyla
