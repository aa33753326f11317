#pragma once
// `hyla serve`'s guardrails on /v1/chat/completions: the agent runtime's rules (agent/guardrails.h)
// applied to a conversation the client drives. The server never runs a tool, so it guards the
// conversation it is given and the reply it returns:
// - before generating: the conversation ends with `max_consecutive_failures` failed tool results
//   in a row (tool messages that are a JSON object with an "error" member; a user message starts
//   over), or it holds `max_steps` assistant turns since its last user message: nothing is
//   generated (status "gave_up" or "step_budget");
// - after: a reply with an invalid call (a <tool_call> block that does not parse, e.g. cut short by
//   max_tokens; a tool not offered; arguments outside its schema) never reaches the client as
//   tool_calls (status "invalid_tool_call"); a reply without calls whose mean token log-probability
//   is below `min_confidence` abstains (status "abstained").
// A choice a guardrail stopped has the fallback text as its content, finish_reason "stop", and
// "guardrail": {"status", "detail"}; /metrics counts each status.
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hyla/data/chat_template.h"
#include "hyla/agent/tools.h"

namespace hyla {

struct ServeGuardrails {
  int64_t max_steps = 0;                 // 0: no limit
  int64_t max_consecutive_failures = 0;  // 0: no limit
  double min_confidence = -std::numeric_limits<double>::infinity();
  std::string fallback = "I cannot complete this request reliably.";
  bool judges_confidence() const { return std::isfinite(min_confidence); }
};

struct GuardrailStop {
  std::string status, detail;
  nlohmann::json to_json() const { return {{"status", status}, {"detail", detail}}; }
};

std::optional<GuardrailStop> conversation_guardrail(std::span<const ChatMessage> messages, const ServeGuardrails& g);

// `token_logprobs`: the reply's, present whenever g judges confidence. `offered`: the request's
// tools (null when none were offered: the reply is plain text, and has no calls to judge).
std::optional<GuardrailStop> reply_guardrail(const AssistantReply& reply, std::span<const double> token_logprobs,
                                             const std::vector<Tool>* offered, const ServeGuardrails& g);

}  // namespace hyla
