#pragma once
// Faults injected into an episode's tool calls: a share of distinct calls (a tool and its exact
// arguments) is faulty, each with one of four kinds. An explicit fault answers with an error and
// the call has no effect; a silent fault answers like a success with a wrong result (and a call
// with effects has none). A transient fault hits only the first time that exact call is made (a
// retry works); a permanent one every time (the agent must work around it: another form of the
// same request). Every fault reaches the model as the tool's observation, never as an episode end.
// Decisions are a pure function of the episode's seed and the call, so an episode replays exactly.
#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace hyla {

enum class FaultKind : uint8_t { None, ExplicitTransient, ExplicitPermanent, SilentTransient, SilentPermanent };
inline constexpr std::array<FaultKind, 4> kFaultKinds = {FaultKind::ExplicitTransient, FaultKind::ExplicitPermanent,
                                                         FaultKind::SilentTransient, FaultKind::SilentPermanent};
const char* to_string(FaultKind kind);  // "explicit_transient", ...
bool is_explicit(FaultKind kind);

// The error texts of explicit faults: a transient one asks for a retry, a permanent one does not.
inline constexpr const char* kTransientFaultError = "timeout: the tool did not answer, try again";
inline constexpr const char* kPermanentFaultError = "rejected: the tool cannot serve this request as written";

struct FaultConfig {
  double share = 0.2;  // of distinct calls
  // Relative weights of the kinds, in kFaultKinds' order.
  std::array<double, 4> weights = {1, 1, 1, 1};
};

class FaultInjector {
 public:
  FaultInjector(const FaultConfig& config, uint64_t episode_seed);
  // The fault this call meets now (None for most); `call_key` is the tool name and its arguments
  // in a canonical form.
  FaultKind next(const std::string& call_key);

 private:
  FaultConfig config_;
  uint64_t seed_;
  std::map<std::string, int64_t> seen_;  // times each call was made
};

}  // namespace hyla
