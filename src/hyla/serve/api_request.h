#pragma once
// Reading OpenAI-style request bodies (/v1/completions and /v1/chat/completions) into engine
// requests. Every field is type-checked and range-checked here; anything wrong is an ApiError
// naming the field, never an exception from deep inside the engine.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hyla/data/chat_template.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/engine.h"
#include "hyla/agent/tools.h"
#include "hyla/serve/serve_guardrails.h"

namespace hyla {

struct ServeLimits {
  size_t max_body_bytes = size_t(4) << 20;
  int64_t max_tokens = 4096;  // per choice
  int64_t max_choices = 64;   // prompts × n in one request
  int64_t context = 8192;     // prompt + max_tokens (the engine's context)
  // Chat image parts (data URLs only): how many per request, and each one's decoded bytes and
  // pixels, checked before it is decoded. Images are never resized (data/image_file.h).
  int64_t max_images = 8;
  int64_t max_image_bytes = int64_t(4) << 20;
  int64_t max_image_pixels = int64_t(2048) * 2048;
  VisionConfig vision;  // the served model's; not enabled: image parts are refused
  ServeGuardrails guardrails;  // chat only
};

struct ApiRequest {
  bool chat = false;
  std::vector<std::vector<int32_t>> prompts;  // token ids of each prompt
  int64_t n = 1;                              // choices per prompt
  bool stream = false, include_usage = false;
  bool echo = false;      // completions: the prompt's text (and logprobs) lead each choice
  int logprobs = -1;      // alternatives per position for logprobs, -1: no logprobs
  ChatOptions chat_options;  // chat: the tools, tool_choice and thinking the template rendered, which reading the reply needs
  std::string prefill;    // chat: text forced at the start of the reply (tool_choice "required"/named)
  std::vector<Tool> tools;  // chat: the tools offered, which every call of a reply must fit
  ServeGuardrails guardrails;
  std::optional<GuardrailStop> stopped;  // chat: a guardrail answers before anything is generated
  GenerationRequest generation;  // max_tokens, sampling, stop (prompt filled per choice)
};

// `served_model`: requests naming another model are 404 model_not_found; a request without
// "model" gets the served one.
ApiRequest parse_completion_request(const nlohmann::json& body, const Tokenizer& tokenizer,
                                    const std::string& served_model, const ServeLimits& limits);
// OpenAI's reasoning effort (minimal, low, medium, high; or max) as Kimi K3's thinking effort
// (low, high, max); an ApiError naming `param` otherwise.
std::string thinking_effort_of(const std::string& effort, const std::string& param);

ApiRequest parse_chat_request(const nlohmann::json& body, const Tokenizer& tokenizer, const std::string& served_model,
                              const ServeLimits& limits);

}  // namespace hyla
