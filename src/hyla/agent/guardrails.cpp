#include "hyla/agent/guardrails.h"

namespace hyla {


std::optional<std::string> invalid_call_error(const AssistantReply& reply, std::span<const Tool> tools) {
  for (const ToolCall& call : reply.tool_calls) {
    const CheckedCall checked = check_call(tools, call);
    if (!checked.tool) return checked.error;
  }
  if (reply.malformed_call) return std::string(kMalformedCallError);
  return std::nullopt;
}

bool failed_observation(const nlohmann::json& observation) {
  return observation.is_object() && observation.contains("error");
}

bool failed_tool_message(std::string_view content) {
  return failed_observation(nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false));
}

double mean_logprob(std::span<const double> logprobs) {
  if (logprobs.empty()) return 0.0;
  double sum = 0;
  for (double lp : logprobs) sum += lp;
  return sum / double(logprobs.size());
}

}  // namespace hyla
