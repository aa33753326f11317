// The OpenAI Responses API's seam (serve/responses_api.h): input items read into the chat messages
// they mean, chat chunks written as Response events in the order the SDK accumulates them, the
// store previous_response_id reads, and malformed bodies refused with the field named. The SDK
// drives the whole route in Serve.OpenAiResponsesClientEndToEnd.
#include <gtest/gtest.h>

#include <thread>

#include "hyla/serve/responses_api.h"

namespace hyla {
namespace {

using json = nlohmann::json;

TEST(ResponsesApi, ItemsBecomeTheChatMessagesTheyMean) {
  const json history = json::array({{{"role", "user"}, {"content", "earlier"}},
                                    {{"role", "assistant"}, {"content", nullptr},
                                     {"tool_calls", json::array({{{"id", "call_0"}, {"type", "function"},
                                                                  {"function", {{"name", "f"}, {"arguments", "{}"}}}}})}}});
  const json body = json::parse(R"({
    "instructions": "Be brief.", "max_output_tokens": 40, "reasoning": {"effort": "medium"},
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": {"type": "function", "name": "f"},
    "input": [
      {"type": "function_call_output", "call_id": "call_0", "output": "done"},
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Think."}]},
      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"a\": 1}"},
      {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "ok"}]}]})");
  const ResponsesRequest read = chat_body_from_responses(body, history);
  const json& m = read.chat["messages"];
  ASSERT_EQ(m.size(), 8u);
  EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1]["content"], "earlier");
  EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", "done"}}));
  EXPECT_EQ(m[4], json({{"role", "system"}, {"content", "Use tools."}}));
  EXPECT_EQ(m[5], json({{"role", "user"}, {"content", "Go"}}));
  EXPECT_EQ(m[6]["reasoning_content"], "Think.");
  EXPECT_EQ(m[6]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m[7]["content"], "ok");
  EXPECT_EQ(read.chat["max_tokens"], 40);
  EXPECT_EQ(read.chat["chat_template_kwargs"]["thinking_effort"], "high");
  EXPECT_EQ(read.chat["response_format"]["json_schema"]["schema"], json({{"type", "object"}}));
  EXPECT_EQ(read.chat["tool_choice"]["function"]["name"], "f");
  // What a later response continues: everything but the instructions.
  EXPECT_EQ(read.conversation.size(), 7u);
  EXPECT_EQ(read.conversation[0]["content"], "earlier");
}

TEST(ResponsesApi, MalformedBodiesNameTheField) {
  const auto expect_refused = [](const std::string& text, const std::string& param, const std::string& words) {
    try {
      chat_body_from_responses(json::parse(text), json::array());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << text;
      EXPECT_EQ(e.param, param) << text;
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_refused(R"({"input": []})", "input", "non-empty");
  expect_refused(R"({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]})", "input[0].call_id",
                 "no function call");
  expect_refused(R"({"input": [{"type": "item_reference", "id": "x"}]})", "input[0]", "'item_reference' item");
  expect_refused(R"({"input": [{"role": "tool", "content": "x"}]})", "input[0].role", "must be user");
  expect_refused(R"({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})", "input[0].content[0]", "'input_file' part");
  expect_refused(R"({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]})",
                 "input[0].content[0]", "no file ids");
  expect_refused(R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0]", "hosted tools");
  expect_refused(R"({"input": "x", "reasoning": {"effort": "extreme"}})", "reasoning.effort", "minimal, low, medium, high or max");
  expect_refused(R"({"input": "x", "instructions": 3})", "instructions", "string");
}

// The event types of an SSE text, in order.
std::vector<std::string> types_of(const std::string& sse) {
  std::vector<std::string> out;
  for (size_t at = sse.find("event: "); at != std::string::npos; at = sse.find("event: ", at + 1))
    out.push_back(sse.substr(at + 7, sse.find('\n', at) - at - 7));
  return out;
}

TEST(ResponsesApi, ChatChunksBecomeEventsAndAConversation) {
  ResponseEvents events(response_header(json{{"input", "x"}}, "resp_1", 0, "m"));
  const auto chunk = [](json delta, json finish = nullptr) {
    return json{{"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish}}})}};
  };
  std::string sse = events.push(chunk({{"role", "assistant"}, {"content", ""}}));
  sse += events.push(chunk({{"reasoning_content", "Hm."}}));
  sse += events.push(chunk({{"content", "Hi"}}));
  sse += events.push(chunk({{"tool_calls", json::array({{{"index", 0}, {"id", "call_1"}, {"type", "function"},
                                                          {"function", {{"name", "f"}, {"arguments", "{}"}}}}})}}));
  json last = chunk(json::object(), "tool_calls");
  last["usage"] = {{"prompt_tokens", 5}, {"completion_tokens", 4}};
  sse += events.push(last);
  EXPECT_EQ(types_of(sse),
            (std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                      "response.content_part.added", "response.reasoning_text.delta",
                                      "response.reasoning_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.output_item.added",
                                      "response.content_part.added", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.output_item.added",
                                      "response.function_call_arguments.delta",
                                      "response.function_call_arguments.done", "response.output_item.done",
                                      "response.completed"}));
  const std::string completed = sse.substr(sse.rfind("data: ") + 6);
  const json response = json::parse(completed.substr(0, completed.find('\n')))["response"];
  EXPECT_EQ(response["status"], "completed");
  ASSERT_EQ(response["output"].size(), 3u);
  EXPECT_EQ(response["output"][1]["content"][0]["text"], "Hi");
  EXPECT_EQ(response["output"][2]["call_id"], "call_1");
  EXPECT_EQ(response["usage"]["total_tokens"], 9);
  EXPECT_EQ(events.assistant_message()["reasoning_content"], "Hm.");
  EXPECT_EQ(events.assistant_message()["tool_calls"][0]["id"], "call_1");
}

TEST(ResponsesApi, TheStoreKeepsConversationsForItsTimeAndWithinItsBytes) {
  ResponseStore store(std::chrono::seconds(3600), 100);
  store.put("a", json::array({std::string(40, 'a')}));
  store.put("b", json::array({std::string(40, 'b')}));
  EXPECT_TRUE(store.get("a") && store.get("b"));
  store.put("c", json::array({std::string(40, 'c')}));  // past 100 bytes: the oldest goes
  EXPECT_FALSE(store.get("a"));
  EXPECT_TRUE(store.get("b") && store.get("c"));
  store.put("huge", json::array({std::string(200, 'h')}));  // larger than the store: never kept
  EXPECT_FALSE(store.get("huge"));
  // A byte-level model's reply may hold invalid UTF-8: kept as it is (a 500 before).
  store.put("bytes", json::array({{{"role", "assistant"}, {"content", std::string("ok \xff\xfe")}}}));
  ASSERT_TRUE(store.get("bytes"));
  EXPECT_EQ((*store.get("bytes"))[0]["content"], std::string("ok \xff\xfe"));
  ResponseStore brief(std::chrono::seconds(0), 1000);
  brief.put("x", json::array());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(brief.get("x"));
}

}  // namespace
}  // namespace hyla
