#pragma once
// /metrics: the engine's counters and latency histograms and the server's HTTP responses in the
// Prometheus text exposition format (version 0.0.4).
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "hyla/infer/engine.h"
#include "hyla/model/expert_offload.h"

namespace hyla {

// What the server itself counts: HTTP responses by path and status, and chat choices a guardrail
// stopped, by its status (serve_guardrails.h).
class ServerCounters {
 public:
  void add_response(const std::string& path, int status);
  void add_guardrail(const std::string& status);
  std::map<std::pair<std::string, int>, int64_t> responses() const;
  std::map<std::string, int64_t> guardrails() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> responses_;
  std::map<std::string, int64_t> guardrails_;
};

// `offload`: the expert cache's counters when the routed experts are offloaded (per MoE layer).
std::string prometheus_metrics(const EngineStats& engine, const ServerCounters& server, int64_t slots,
                               const std::optional<ExpertOffloadStats>& offload = std::nullopt);

}  // namespace hyla
