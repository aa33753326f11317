#pragma once
// The JSON shapes of OpenAI's completion and chat-completion responses and stream chunks, built
// from engine outputs.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hyla/data/chat_template.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/engine.h"
#include "hyla/serve/api_request.h"

namespace hyla {

// A random id such as "cmpl-3F9a…" (prefix + 24 characters).
std::string random_id(const std::string& prefix);

// What every response (and stream chunk) starts with.
struct ResponseHeader {
  std::string id, object, model;
  int64_t created = 0;
  nlohmann::json to_json() const;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  void add(const GenerationOutput& out);
  nlohmann::json to_json() const;
};

// One finished choice: its engine output and the prompt it continued.
struct FinishedChoice {
  int64_t index = 0;
  const std::vector<int32_t>* prompt = nullptr;
  GenerationOutput output;
};

// Engine finish reasons and tool calls in OpenAI's words ("stop", "length", "tool_calls").
std::string finish_reason(const GenerationOutput& out, bool has_tool_calls);

// The stop string that ended a choice, else null: vLLM's `stop_reason` beside `finish_reason`.
nlohmann::json stop_reason(const GenerationOutput& out);

// /v1/completions: text (after the prompt's text with echo) and the `logprobs` object
// {tokens, token_logprobs, top_logprobs, text_offset}.
nlohmann::json completion_response(const ResponseHeader& header, const ApiRequest& request,
                                   const std::vector<FinishedChoice>& choices, const Tokenizer& tokenizer);
nlohmann::json completion_chunk(const ResponseHeader& header, int64_t index, const std::string& text,
                                 const nlohmann::json& finish_reason);

// A chat choice's reply as it is returned: `parsed` (the generated text split into content and tool
// calls) judged by the request's guardrails (serve_guardrails.h); when one stops it, the fallback.
struct ChatReply {
  AssistantReply reply;
  std::optional<GuardrailStop> guardrail;
};
ChatReply chat_reply(const ApiRequest& request, const GenerationOutput& out, AssistantReply parsed);

// /v1/chat/completions: a message with content and parsed tool calls; logprobs as {content: [...]};
// "guardrail" in a choice a guardrail stopped.
nlohmann::json chat_response(const ResponseHeader& header, const ApiRequest& request,
                             const std::vector<FinishedChoice>& choices, const Tokenizer& tokenizer);
nlohmann::json chat_chunk(const ResponseHeader& header, int64_t index, const nlohmann::json& delta,
                          const nlohmann::json& finish_reason);
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls);

}  // namespace hyla
