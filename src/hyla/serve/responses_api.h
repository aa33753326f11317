#pragma once
// The OpenAI Responses API (/v1/responses) over the chat path, as anthropic_api.h does for
// Anthropic's: a Responses body is read into the chat-completions body it means (api_request.h
// reads it), and the chat response or its chunk stream is written back as a Response object or
// its events. Errors keep OpenAI's shape.
//
// What crosses the seam, JSON both ways:
//   instructions                         -> a leading system message (not carried by previous_response_id)
//   input: text, or items:
//     message {role, content: text | input_text / output_text / input_image parts}
//                                        -> that message (developer as system; data-URL images only)
//     reasoning {content: reasoning_text | summary: summary_text}
//                                        -> reasoning_content of the assistant message that follows
//     function_call {call_id, name, arguments}
//                                        -> a tool call of the assistant message it follows
//     function_call_output {call_id, output}
//                                        -> a tool message answering that call (it must have been made)
//   tools [{type: function, name, description, parameters}], tool_choice, max_output_tokens,
//   temperature, top_p, text.format (json_schema, json_object), reasoning.effort
//                                        -> chat_template_kwargs.thinking_effort (minimal and low: low,
//                                           medium and high: high, max: max)
// and back: reasoning -> a reasoning item (reasoning_text), content -> a message item
// (output_text), each call -> a function_call item; a reply cut by max_output_tokens is
// "incomplete". The conversation a response ends (its input and reply as chat messages) is what
// previous_response_id continues (ResponseStore keeps it).
#include <chrono>
#include <list>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hyla/serve/api_error.h"

namespace hyla {

// A Responses body read: the chat body it means, and the messages a later response continuing
// this one starts from (the history and this input, without the instructions).
struct ResponsesRequest {
  nlohmann::json chat;
  nlohmann::json conversation;
};

// `history`: the conversation of the response `previous_response_id` names (an empty array when none).
ResponsesRequest chat_body_from_responses(const nlohmann::json& body, const nlohmann::json& history);

// The Response object fields that echo the request (model, instructions, tools, sampling, …) and
// the response's id and creation time.
struct ResponseHeaderFields {
  std::string id;
  int64_t created_at = 0;
  nlohmann::json echo;  // request fields a Response repeats
};
ResponseHeaderFields response_header(const nlohmann::json& body, const std::string& id, int64_t created_at,
                                     const std::string& model);

// The Response a chat.completion response (one choice) is.
nlohmann::json response_from_chat(const nlohmann::json& chat, const ResponseHeaderFields& header);

// The Response events written from the chat stream's chunks: response.created, in_progress, per
// item output_item.added / content_part.added / *.delta / *.done / output_item.done, then
// response.completed with the whole Response; an error object becomes an `error` event.
class ResponseEvents {
 public:
  explicit ResponseEvents(ResponseHeaderFields header);
  std::string push(const nlohmann::json& chunk);
  // The reply as a chat assistant message (for ResponseStore), once the stream has finished.
  nlohmann::json assistant_message() const;

 private:
  std::string event(const std::string& type, nlohmann::json data);
  std::string open_item(const std::string& type);
  std::string close_item();
  nlohmann::json response(const std::string& status) const;

  ResponseHeaderFields header_;
  int64_t sequence_ = 0;
  bool started_ = false;
  nlohmann::json output_ = nlohmann::json::array();  // items closed so far
  std::string open_, item_id_, text_;                // the item being written and its text
  nlohmann::json call_;                              // the function_call being written
  std::string reasoning_, content_;
  nlohmann::json tool_calls_ = nlohmann::json::array();
  nlohmann::json usage_, incomplete_ = nullptr;
};

// The conversations previous_response_id continues, kept for `ttl` and within `max_bytes` (their
// JSON's size): the oldest go first. Thread-safe.
class ResponseStore {
 public:
  ResponseStore(std::chrono::seconds ttl, size_t max_bytes) : ttl_(ttl), max_bytes_(max_bytes) {}
  void put(const std::string& id, nlohmann::json conversation);
  std::optional<nlohmann::json> get(const std::string& id);

 private:
  struct Entry {
    std::string id;
    nlohmann::json conversation;
    size_t bytes;
    std::chrono::steady_clock::time_point stored;
  };
  void evict(std::chrono::steady_clock::time_point now);

  std::mutex mutex_;
  std::chrono::seconds ttl_;
  size_t max_bytes_, bytes_ = 0;
  std::list<Entry> entries_;  // oldest first
  std::map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace hyla
