#include "hyla/serve/metrics.h"

#include <fmt/format.h>

namespace hyla {

void ServerCounters::add_response(const std::string& path, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++responses_[{path, status}];
}

void ServerCounters::add_guardrail(const std::string& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++guardrails_[status];
}

std::map<std::pair<std::string, int>, int64_t> ServerCounters::responses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return responses_;
}

std::map<std::string, int64_t> ServerCounters::guardrails() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return guardrails_;
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

// Per MoE layer: counters (rates come from them) and, for reading at a glance, the ratios so far.
void expert_offload_metrics(std::string& out, const ExpertOffloadStats& o) {
  const auto per_layer = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n", name, help, type);
    for (size_t l = 0; l < o.layers.size(); ++l) out += fmt::format("{}{{moe_layer=\"{}\"}} {}\n", name, l, value(o.layers[l]));
  };
  using S = const ExpertLayerStats&;
  per_layer("hyla_expert_requests_total", "counter", "Experts a forward needed (each distinct expert once per forward).",
            [](S l) { return l.requests; });
  per_layer("hyla_expert_hits_total", "counter", "Needed experts that were resident or already being prefetched.",
            [](S l) { return l.hits; });
  per_layer("hyla_expert_predicted_total", "counter", "Experts the previous layer's prediction named.",
            [](S l) { return l.predicted; });
  per_layer("hyla_expert_predicted_used_total", "counter", "Predicted experts the forward needed.",
            [](S l) { return l.predicted_used; });
  per_layer("hyla_expert_predicted_needed_total", "counter", "Experts needed by forwards that had a prediction.",
            [](S l) { return l.predicted_needed; });
  per_layer("hyla_expert_fetched_bytes_total", "counter", "Expert bytes packed from the model's files (misses and prefetches).",
            [](S l) { return l.fetched_bytes; });
  per_layer("hyla_expert_stall_seconds_total", "counter", "Time the compute waited for expert weights.",
            [](S l) { return l.stall_seconds; });
  per_layer("hyla_expert_hit_rate", "gauge", "hits / requests so far.", [](S l) { return l.hit_rate(); });
  per_layer("hyla_expert_prefetch_precision", "gauge", "predicted_used / predicted so far.", [](S l) { return l.precision(); });
  per_layer("hyla_expert_prefetch_recall", "gauge", "predicted_used / predicted_needed so far.", [](S l) { return l.recall(); });
  counter(out, "hyla_expert_offload_tokens_total", "Token rows through the offloaded model.", o.tokens);
  gauge(out, "hyla_expert_slots_per_layer", "Experts each MoE layer keeps resident.", o.slots_per_layer);
  out += fmt::format("# HELP hyla_expert_bytes_read_per_token Expert bytes fetched per token row so far.\n"
                     "# TYPE hyla_expert_bytes_read_per_token gauge\nhyla_expert_bytes_read_per_token {}\n",
                     o.bytes_per_token());
  out += fmt::format("# HELP hyla_expert_stall_seconds_per_token Expert waits per token row so far.\n"
                     "# TYPE hyla_expert_stall_seconds_per_token gauge\nhyla_expert_stall_seconds_per_token {}\n",
                     o.stall_seconds_per_token());
}

}  // namespace

std::string prometheus_metrics(const EngineStats& s, const ServerCounters& server, int64_t slots,
                               const std::optional<ExpertOffloadStats>& offload) {
  std::string out;
  counter(out, "hyla_requests_total", "Generation requests submitted to the engine.", s.requests);
  out += "# HELP hyla_requests_finished_total Generation requests finished, by reason.\n"
         "# TYPE hyla_requests_finished_total counter\n";
  for (FinishReason reason : kFinishReasons)
    out += fmt::format("hyla_requests_finished_total{{reason=\"{}\"}} {}\n", to_string(reason), s.finished[size_t(reason)]);
  counter(out, "hyla_prompt_tokens_total", "Prompt tokens received.", s.prompt_tokens);
  counter(out, "hyla_prompt_tokens_cached_total", "Prompt tokens restored from the prompt-state cache.", s.cached_prompt_tokens);
  counter(out, "hyla_prompt_tokens_read_total", "Prompt tokens the model read (computed, not restored).",
          s.prompt_tokens - s.cached_prompt_tokens);
  out += "# HELP hyla_prompt_state_restores_total Prompts that restored a cached prefix (hit) or read from the start (miss).\n"
         "# TYPE hyla_prompt_state_restores_total counter\n";
  out += fmt::format("hyla_prompt_state_restores_total{{result=\"hit\"}} {}\n", s.prompt_state_hits);
  out += fmt::format("hyla_prompt_state_restores_total{{result=\"miss\"}} {}\n", s.prompt_state_misses);
  counter(out, "hyla_generation_tokens_total", "Tokens generated.", s.generated_tokens);
  histogram(out, "hyla_time_to_first_token_seconds", "Time from submission to the first generated token.", s.ttft);
  histogram(out, "hyla_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", s.itl);
  gauge(out, "hyla_requests_running", "Requests holding a sequence slot.", s.running);
  gauge(out, "hyla_prompt_state_bytes", "Memory the prompt-state snapshots hold.", s.prompt_state_bytes);
  gauge(out, "hyla_prompt_state_snapshots", "Prompt-state snapshots held.", s.prompt_state_snapshots);
  gauge(out, "hyla_requests_waiting", "Requests queued for a slot.", s.waiting);
  gauge(out, "hyla_sequence_slots", "Sequences decoded together at most.", slots);
  out += "# HELP hyla_http_responses_total HTTP responses, by path and status.\n# TYPE hyla_http_responses_total counter\n";
  for (const auto& [key, count] : server.responses())
    out += fmt::format("hyla_http_responses_total{{path=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
  out += "# HELP hyla_guardrail_stops_total Chat choices a guardrail stopped, by status.\n"
         "# TYPE hyla_guardrail_stops_total counter\n";
  for (const auto& [status, count] : server.guardrails())
    out += fmt::format("hyla_guardrail_stops_total{{status=\"{}\"}} {}\n", status, count);
  if (offload) expert_offload_metrics(out, *offload);
  return out;
}

}  // namespace hyla
