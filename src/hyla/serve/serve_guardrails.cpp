#include "hyla/serve/serve_guardrails.h"

#include <fmt/format.h>

#include "hyla/agent/agent.h"
#include "hyla/agent/guardrails.h"

namespace hyla {

std::optional<GuardrailStop> conversation_guardrail(std::span<const ChatMessage> messages, const ServeGuardrails& g) {
  FailureStreak failures;
  int64_t steps = 0;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") failures = {}, steps = 0;
    if (m.role == "assistant") ++steps;
    if (m.role == "tool") failures.record(failed_tool_message(m.content));
  }
  if (failures.reached(g.max_consecutive_failures))
    return GuardrailStop{to_string(EpisodeStatus::GaveUp),
                         fmt::format("the last {} tool results were errors (serve --max-tool-failures {})",
                                     failures.length(), g.max_consecutive_failures)};
  if (g.max_steps > 0 && steps >= g.max_steps)
    return GuardrailStop{to_string(EpisodeStatus::StepBudget),
                         fmt::format("{} assistant turns since the last user message (serve --max-agent-steps {})",
                                     steps, g.max_steps)};
  return std::nullopt;
}

std::optional<GuardrailStop> reply_guardrail(const AssistantReply& reply, std::span<const double> token_logprobs,
                                             const std::vector<Tool>* offered, const ServeGuardrails& g) {
  if (offered && (!reply.tool_calls.empty() || reply.malformed_call)) {
    if (const std::optional<std::string> error = invalid_call_error(reply, *offered))
      return GuardrailStop{"invalid_tool_call", *error};
    return std::nullopt;
  }
  const double mean = mean_logprob(token_logprobs);
  if (below_confidence(mean, g.min_confidence))
    return GuardrailStop{to_string(EpisodeStatus::Abstained),
                         fmt::format("mean token log-probability {:.4f} is below {} (serve --min-confidence)", mean,
                                     g.min_confidence)};
  return std::nullopt;
}

}  // namespace hyla
