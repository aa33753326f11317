#include "hyla/agent/faults.h"

#include "hyla/core/error.h"
#include "hyla/core/random.h"

namespace hyla {

const char* to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::None: return "none";
    case FaultKind::ExplicitTransient: return "explicit_transient";
    case FaultKind::ExplicitPermanent: return "explicit_permanent";
    case FaultKind::SilentTransient: return "silent_transient";
    case FaultKind::SilentPermanent: return "silent_permanent";
  }
  return "?";
}

bool is_explicit(FaultKind kind) { return kind == FaultKind::ExplicitTransient || kind == FaultKind::ExplicitPermanent; }

FaultInjector::FaultInjector(const FaultConfig& config, uint64_t episode_seed) : config_(config), seed_(episode_seed) {
  HYLA_CHECK(config.share >= 0 && config.share <= 1, "faults.share {} is not in [0, 1]", config.share);
  double total = 0;
  for (double w : config.weights) {
    HYLA_CHECK(w >= 0, "faults: a kind's weight {} is negative", w);
    total += w;
  }
  HYLA_CHECK(config.share == 0 || total > 0, "faults: share {} needs a kind with a positive weight", config.share);
}

FaultKind FaultInjector::next(const std::string& call_key) {
  const int64_t made = seen_[call_key]++;
  if (config_.share == 0) return FaultKind::None;
  Rng rng(seed_ ^ hash_string(call_key));
  if (rng.uniform() >= config_.share) return FaultKind::None;
  double total = 0;
  for (double w : config_.weights) total += w;
  double u = rng.uniform() * total;
  FaultKind kind = FaultKind::None;
  for (size_t k = 0; k < kFaultKinds.size(); ++k)
    if (config_.weights[k] > 0) kind = kFaultKinds[k];  // the last possible one, should rounding leave u past every weight
  for (size_t k = 0; k < kFaultKinds.size(); ++k) {
    if (config_.weights[k] > 0 && u < config_.weights[k]) {
      kind = kFaultKinds[k];
      break;
    }
    u -= config_.weights[k];
  }
  const bool transient = kind == FaultKind::ExplicitTransient || kind == FaultKind::SilentTransient;
  return transient && made > 0 ? FaultKind::None : kind;
}

}  // namespace hyla
