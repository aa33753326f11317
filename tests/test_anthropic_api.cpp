// The Anthropic Messages API's seam (serve/anthropic_api.h): Messages bodies read into the chat
// bodies they mean, chat responses and chunk streams written back as Anthropic's message and
// events, and malformed bodies refused with the field named. The SDK drives the whole route in
// Serve.AnthropicSdkEndToEnd.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "hyla/serve/anthropic_api.h"

namespace hyla {
namespace {

using json = nlohmann::json;

TEST(AnthropicApi, BlocksBecomeTheChatMessagesTheyMean) {
  const json body = json::parse(R"({
    "model": "m", "max_tokens": 50, "temperature": 0.5, "stop_sequences": ["END"],
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any"}, "thinking": {"type": "disabled"},
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                                   {"type": "text", "text": "Thanks"}]}]})");
  const json chat = chat_body_from_messages(body);
  EXPECT_EQ(chat["max_tokens"], 50);
  EXPECT_EQ(chat["stop"], json::array({"END"}));
  EXPECT_EQ(chat["tool_choice"], "required");
  EXPECT_EQ(chat["chat_template_kwargs"]["thinking"], false);
  EXPECT_EQ(chat["tools"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"], json({{"type", "object"}}));
  const json& m = chat["messages"];
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1]["content"], "Weather in Paris?");
  EXPECT_EQ(m[2]["reasoning_content"], "Use the tool.");
  EXPECT_EQ(m[2]["content"], "Checking.");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(json::parse(m[2]["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "18 C"}}));
  EXPECT_EQ(m[4]["role"], "user");
  EXPECT_EQ(m[4]["content"][0]["text"], "Thanks");
}

TEST(AnthropicApi, MalformedBodiesNameTheField) {
  const auto expect_refused = [](const std::string& text, const std::string& param, const std::string& words) {
    try {
      chat_body_from_messages(json::parse(text));
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << text;
      EXPECT_EQ(e.param, param) << text;
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_EQ(anthropic_error(e)["error"]["type"], "invalid_request_error");
    }
  };
  const std::string hi = R"("messages": [{"role": "user", "content": "hi"}])";
  expect_refused("[]", "", "JSON object");
  expect_refused("{" + hi + "}", "max_tokens", "required");
  expect_refused(R"({"max_tokens": 5, "temperature": 1.5, )" + hi + "}", "temperature", "[0, 1]");
  expect_refused(R"({"max_tokens": 5, "messages": []})", "messages", "non-empty");
  expect_refused(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "messages[0].role", "user or assistant");
  expect_refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [7]}]})", "messages[0].content[0]", "'type'");
  expect_refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]}]})",
                 "messages[0].content[0].tool_use_id", "did not make");
  expect_refused(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]})",
                 "messages[0].content[0]", "'document' block");
  expect_refused(R"({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 3}]}]})",
                 "messages[0].content[0]", "object 'input'");
  expect_refused(R"({"max_tokens": 5, "tools": [{"type": "bash_20250124", "name": "bash"}], )" + hi + "}", "tools[0]",
                 "only tools the client defines");
  expect_refused(R"({"max_tokens": 5, "tool_choice": {"type": "some"}, )" + hi + "}", "tool_choice", "auto");
  expect_refused(R"({"max_tokens": 5, "system": [{"type": "image"}], )" + hi + "}", "system[0]", "only text blocks");
  // A tool result answers the assistant turn just before it, not an older one.
  expect_refused(R"({"max_tokens": 5, "messages": [
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
      {"role": "assistant", "content": "ok"},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]})",
                 "messages[3].content[0].tool_use_id", "did not make");
}

// The events of a stream: (name, data) in order, each "event: NAME\ndata: JSON\n\n".
std::vector<std::pair<std::string, json>> events_of(const std::string& sse) {
  std::vector<std::pair<std::string, json>> out;
  for (size_t at = 0; at < sse.size();) {
    const size_t data = sse.find("\ndata: ", at), end = sse.find("\n\n", at);
    EXPECT_EQ(sse.compare(at, 7, "event: "), 0) << sse.substr(at);
    out.emplace_back(sse.substr(at + 7, data - at - 7), json::parse(sse.substr(data + 7, end - data - 7)));
    at = end + 2;
  }
  return out;
}

TEST(AnthropicApi, ChatChunksBecomeBlocksInOrder) {
  MessageEvents events("msg_1", "m", 12);
  const auto chunk = [](json delta, json finish = nullptr) {
    return json{{"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish}}})}};
  };
  std::string sse = events.push(chunk({{"role", "assistant"}, {"content", ""}}));
  sse += events.push(chunk({{"reasoning_content", "Think."}}));
  sse += events.push(chunk({{"content", "Hel"}}));
  sse += events.push(chunk({{"content", "lo"}}));
  sse += events.push(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_1"}, {"type", "function"},
                                                          {"function", {{"name", "f"}, {"arguments", "{\"a\": 1}"}}}}})}}));
  json last = chunk(json::object(), "tool_calls");
  last["usage"] = {{"prompt_tokens", 12}, {"completion_tokens", 7}};
  sse += events.push(last);
  const auto e = events_of(sse);
  std::vector<std::string> names;
  for (const auto& [name, data] : e) {
    names.push_back(name);
    EXPECT_EQ(data["type"], name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                             "content_block_stop", "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_delta", "content_block_stop", "message_delta",
                                             "message_stop"}));
  EXPECT_EQ(e[0].second["message"]["usage"]["input_tokens"], 12);
  EXPECT_EQ(e[1].second["content_block"]["type"], "thinking");
  EXPECT_EQ(e[2].second["delta"], json({{"type", "thinking_delta"}, {"thinking", "Think."}}));
  EXPECT_EQ(e[4].second["index"], 1);
  EXPECT_EQ(e[6].second["delta"], json({{"type", "text_delta"}, {"text", "lo"}}));
  EXPECT_EQ(e[8].second["content_block"]["name"], "f");
  EXPECT_EQ(json::parse(e[9].second["delta"]["partial_json"].get<std::string>()), json({{"a", 1}}));
  EXPECT_EQ(e[11].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(e[11].second["usage"]["output_tokens"], 7);
  // An error mid-stream is Anthropic's error event.
  const auto error = events_of(MessageEvents("msg_2", "m", 1).push(
      json{{"error", {{"message", "inference failed"}, {"type", "server_error"}}}}));
  ASSERT_EQ(error.size(), 1u);
  EXPECT_EQ(error[0].first, "error");
  EXPECT_EQ(error[0].second["error"]["type"], "api_error");
}

TEST(AnthropicApi, ChatResponsesBecomeMessages) {
  const json chat = json::parse(R"({"model": "m", "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": "END",
      "message": {"role": "assistant", "content": "Hi", "reasoning_content": "r",
                  "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}}],
      "usage": {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}})");
  const json m = message_from_chat_response(chat, "msg_1");
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "END");
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][1], json({{"type", "text"}, {"text", "Hi"}}));
  EXPECT_EQ(m["content"][2]["input"], json({{"arguments", "not json"}}));  // tool_use input is always an object
  EXPECT_EQ(m["usage"]["input_tokens"], 6);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 4);
  json length = chat;
  length["choices"][0]["finish_reason"] = "length";
  EXPECT_EQ(message_from_chat_response(length, "msg_2")["stop_reason"], "max_tokens");
  EXPECT_EQ(anthropic_error(ApiError(404, "no"))["error"]["type"], "not_found_error");
  EXPECT_EQ(anthropic_error(ApiError(401, "no"))["error"]["type"], "authentication_error");
}

}  // namespace
}  // namespace hyla
