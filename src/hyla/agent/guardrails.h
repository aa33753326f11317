#pragma once
// The guardrails' rules, written once for every agent loop: the runtime of `hyla agent`, `hyla rl`
// and `hyla eval agent` (agent.h), and `hyla serve`'s chat endpoint (serve/serve_guardrails.h).
// - A reply's calls are checked before anything runs them: a <tool_call> block that does not parse,
//   a tool that was not offered, or arguments outside the tool's schema (tools.h) make it invalid.
// - A tool observation failed when it is a JSON object with an "error" member: what the
//   environments and the runtime's own error observations return.
// - After a limit of failed calls in a row (invalid ones included) the loop gives up.
// - A final reply whose mean token log-probability is below a threshold abstains.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "hyla/data/chat_template.h"
#include "hyla/agent/tools.h"

namespace hyla {

// Why the first invalid call of `reply` is invalid (nullopt: every call may run), a call that did
// not parse (AssistantReply::malformed_call) included. Agents speak hyla's chat format, whose
// malformed call the error describes.
std::optional<std::string> invalid_call_error(const AssistantReply& reply, std::span<const Tool> tools);
inline constexpr const char* kMalformedCallError =
    "a <tool_call> block must hold {\"name\": ..., \"arguments\": {...}}";

bool failed_observation(const nlohmann::json& observation);
// A tool message's text: failed when it parses as such an observation.
bool failed_tool_message(std::string_view content);

// Failed calls in a row: a success resets it.
class FailureStreak {
 public:
  void record(bool failed) { length_ = failed ? length_ + 1 : 0; }
  int64_t length() const { return length_; }
  // `limit` 0 means no limit.
  bool reached(int64_t limit) const { return limit > 0 && length_ >= limit; }

 private:
  int64_t length_ = 0;
};

// The mean of a reply's token log-probabilities (0 for an empty reply), and whether it falls below
// the threshold (-infinity: never).
double mean_logprob(std::span<const double> logprobs);
inline bool below_confidence(double mean, double min_confidence) { return mean < min_confidence; }

}  // namespace hyla
