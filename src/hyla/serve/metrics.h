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

class HttpCounters {
 public:
  void add(const std::string& path, int status);
  std::map<std::pair<std::string, int>, int64_t> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> counts_;
};

// `offload`: the expert cache's counters when the routed experts are offloaded (per MoE layer).
std::string prometheus_metrics(const EngineStats& engine, const HttpCounters& http, int64_t slots,
                               const std::optional<ExpertOffloadStats>& offload = std::nullopt);

}  // namespace hyla
