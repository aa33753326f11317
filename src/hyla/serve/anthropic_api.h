#pragma once
// The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) over the chat path: a
// Messages body is read into the chat-completions body it means, which api_request.h reads as every
// chat request is read (one reader of conversations, tools and sampling); the chat response, or
// its stream of chunks, is written back in Anthropic's shapes. Errors take Anthropic's shape.
//
// What crosses the seam: JSON in both directions, nothing of the engine. Blocks map as
//   system (text or text blocks)              -> a system message
//   user text / image (base64 source)         -> user content parts (image_url data URLs)
//   user tool_result {tool_use_id, content}   -> a tool message answering that call (it must answer a
//                                                tool_use of the assistant turn before it)
//   assistant text / thinking / tool_use      -> content / reasoning_content / tool_calls
//   tools {name, description, input_schema}   -> function tools; tool_choice auto / any / tool / none
//                                                -> auto / required / the named function / none
//   thinking {type: enabled | disabled}       -> chat_template_kwargs.thinking
// and back: reasoning -> a thinking block, content -> a text block, each call -> a tool_use block;
// finish "stop" -> end_turn (stop_sequence when a stop string ended it), "length" -> max_tokens,
// "tool_calls" -> tool_use; a streamed call's tool_use block opens with the call and its arguments
// follow as input_json_deltas. cache_control and other annotations on blocks are accepted and ignored.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/serve/api_error.h"

namespace hyla {

// The chat-completions body a Messages body means; an ApiError naming the field where it is not one.
nlohmann::json chat_body_from_messages(const nlohmann::json& body);

// The Messages response a chat.completion response (one choice) is, its id `id`.
nlohmann::json message_from_chat_response(const nlohmann::json& chat, const std::string& id);

// {"type": "error", "error": {"type", "message"}}, its type from the HTTP status.
nlohmann::json anthropic_error(const ApiError& e);

// A Messages stream written from the chat stream's chunks: message_start, then per block
// content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta) /
// content_block_stop, then message_delta (stop_reason, usage) and message_stop.
class MessageEvents {
 public:
  MessageEvents(std::string id, std::string model, int64_t input_tokens);
  // The server-sent events (each "event: NAME\ndata: JSON\n\n") for one chat.completion.chunk, or
  // for an error object ({"error": ...}) the chat stream writes.
  std::string push(const nlohmann::json& chunk);

 private:
  std::string event(const char* name, const nlohmann::json& data);
  std::string open_block(const std::string& type, nlohmann::json block);
  std::string close_block();

  std::string id_, model_;
  int64_t input_tokens_ = 0;
  bool started_ = false;
  int64_t index_ = -1;        // the block being written, -1 before the first
  std::string open_;          // its type ("text", "thinking", "tool_use"), empty when none is open
};

}  // namespace hyla
