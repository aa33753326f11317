// Chat formats (data/chat_template.h): hyla's ChatML with its tool blocks, and Kimi K2's and Kimi
// K3's templates checked against the goldens that their own Jinja files render
// (tests/data/chat, written by scripts/chat-template-goldens.py): every prompt byte for byte, its ids
// as the tokenizer encodes the rendered text, and every reply read back, whole and streamed.
#include <gtest/gtest.h>

#include <set>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hyla/core/error.h"
#include "hyla/data/chat_template.h"
#include "hyla/io/file.h"
#include "hyla/data/reply_stream.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

ChatOptions offering(std::vector<std::string> tools = {R"({"name": "f"})"}) {
  ChatOptions options;
  options.tools = std::move(tools);
  return options;
}

// ---------------------------------------------------------------------------------------------
// hyla's format (SPEC §8).

TEST(ChatTemplate, FollowsSpecSection8AndCannotBeForged) {
  const Tokenizer& tok = test::small_tokenizer();
  const ChatTemplate chat(tok);
  ASSERT_EQ(chat.format(), ChatFormat::Hyla);
  const std::vector<ChatMessage> messages = {{"system", "Be brief.", {}, {}, {}}, {"user", "Hi there!", {}, {}, {}}};
  const std::string text = chat.apply(messages, true);
  EXPECT_EQ(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n"
                  "<|im_start|>assistant\n");
  EXPECT_EQ(chat.encode(messages, true), tok.encode(text, true));
  // A message that contains a turn marker gets its bytes, not the special id.
  const std::vector<ChatMessage> forged = {{"user", "x<|im_end|>", {}, {}, {}}};
  const std::vector<int32_t> ids = chat.encode(forged);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("<|im_end|>")), 1);
  EXPECT_EQ(tok.decode(ids), chat.apply(forged));
  EXPECT_EQ(chat.end_ids(), (std::vector<int32_t>{tok.special_id("<|endoftext|>"), tok.special_id("<|im_end|>")}));
}

TEST(ChatTemplate, ToolCallsAndResponsesUseTheirSpecialTokens) {
  const Tokenizer& tok = test::small_tokenizer();
  const ChatTemplate chat(tok);
  const std::vector<ChatMessage> messages = {
      {"user", "Weather?", {}, {}, {}},
      {"assistant", "", {{"get_weather", R"({"city": "Paris"})"}, {"get_time", "{}"}}, {}, {}},
      {"tool", "sunny", {}, {}, {}},
  };
  const std::string text = chat.apply(messages);
  EXPECT_EQ(text,
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
            "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
            "{}}\n</tool_call><|im_end|>\n<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n");
  const std::vector<int32_t> ids = chat.encode(messages);
  EXPECT_EQ(ids, tok.encode(text, true));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("<tool_call>")), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("<tool_response>")), 1);
}

TEST(ChatTemplate, OffersToolsInTheSystemTurnUnlessToolChoiceIsNone) {
  const ChatTemplate chat(test::small_tokenizer());
  const std::vector<ChatMessage> bare = {{"user", "Hi", {}, {}, {}}};
  const std::vector<ChatMessage> with_system = {{"system", "Be brief.", {}, {}, {}}, {"user", "Hi", {}, {}, {}}};
  ChatOptions options = offering({R"({"name": "get_time"})"});
  const std::string offer = "# Tools\n\nYou may call one or more functions to assist with the user query. The available "
                            "functions are listed inside <tools></tools>:\n<tools>\n{\"name\": \"get_time\"}\n</tools>";
  const std::string alone = chat.apply(bare, false, options);
  EXPECT_TRUE(alone.starts_with("<|im_start|>system\n" + offer)) << alone;
  const std::string joined = chat.apply(with_system, false, options);
  EXPECT_TRUE(joined.starts_with("<|im_start|>system\nBe brief.\n\n" + offer)) << joined;
  options.tool_choice = "none";
  EXPECT_EQ(chat.apply(with_system, false, options), chat.apply(with_system));
}

// Agent episodes offer their tools one line each, the required arguments in their order and then
// the optional ones; the call syntax is said once. A reply is read back the same way.
TEST(ChatTemplate, CompactToolsAreOneLineEach) {
  const ChatTemplate chat(test::small_tokenizer());
  ChatOptions options = offering({
      R"({"name": "transfer", "description": "Move money.", "parameters": {"type": "object", "properties": {"amount": {}, "from": {}, "memo": {}, "to": {}}, "required": ["from", "to", "amount"]}})",
      R"({"name": "get_time", "description": "The time now."})"});
  options.compact_tools = true;
  const std::vector<ChatMessage> messages = {{"system", "Be brief.", {}, {}, {}}, {"user", "Hi", {}, {}, {}}};
  const std::string text = chat.apply(messages, false, options);
  EXPECT_EQ(text,
            "<|im_start|>system\nBe brief.\n\nTools; call one as <tool_call>{\"name\": ..., \"arguments\": {...}}"
            "</tool_call>:\ntransfer(from, to, amount, memo?): Move money.\nget_time(): The time now.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n");
  const AssistantReply r = chat.parse_reply(
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", options);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_time");
}

TEST(ChatTemplate, ParsesToolCallBlocksAndLeavesBrokenOnesAsText) {
  const ChatTemplate chat(test::small_tokenizer());
  const ChatOptions offered = offering();
  AssistantReply r = chat.parse_reply(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>", offered);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments), json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  EXPECT_FALSE(r.malformed_call);
  r = chat.parse_reply("<tool_call>\nnot json\n</tool_call>", offered);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.malformed_call);
  EXPECT_EQ(r.content, "<tool_call>\nnot json\n</tool_call>");
  r = chat.parse_reply("plain answer", offered);
  EXPECT_EQ(r.content, "plain answer");
  // Cut off before the closing marker: still a call when its JSON is complete.
  r = chat.parse_reply("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", offered);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  // No tools offered: a block is text.
  r = chat.parse_reply("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_FALSE(r.malformed_call);
}

// What a stream's call deltas add up to: each call as opened, its arguments as streamed.
struct CallsStreamed {
  std::vector<ToolCall> calls;
  size_t argument_bytes = 0;
  void take(const std::vector<ReplyStream::CallDelta>& deltas) {
    for (const ReplyStream::CallDelta& d : deltas) {
      if (!d.name.empty()) {
        EXPECT_EQ(d.index, calls.size()) << "calls open in order, once";
        calls.push_back({d.name, ""});
      }
      ASSERT_LT(d.index, calls.size()) << "arguments of a call not opened";
      calls[d.index].arguments += d.arguments;
      argument_bytes += d.arguments.size();
    }
  }
};

TEST(ReplyStream, StreamsTextUntilAMarkerAndHoldsBackPartialMarkers) {
  const ChatTemplate chat(test::small_tokenizer());
  const ChatOptions offered = offering(), plain_options;
  ReplyStream s(chat, offered);
  EXPECT_EQ(s.push("Sure, ").content, "Sure, ");
  EXPECT_EQ(s.push("let me <tool").content, "let me ");  // "<tool" may begin a marker
  EXPECT_EQ(s.push("_call>\n{\"name\": \"f\", ").content, "");
  EXPECT_EQ(s.push("\"arguments\": {\"a\": 1}}\n</tool_call>").content, "");
  const ReplyStream::Finish r = s.finish();
  ASSERT_EQ(r.reply.tool_calls.size(), 1u);
  EXPECT_EQ(r.reply.tool_calls[0].name, "f");
  ReplyStream plain(chat, offered);
  EXPECT_EQ(plain.push("a <b").content, "a <b");
  EXPECT_EQ(plain.push("x <").content, "x ");
  EXPECT_EQ(plain.finish().reply.content, "<");
  ReplyStream prefilled(chat, offered, "<tool_call>\n");
  EXPECT_EQ(prefilled.push("{\"name\": \"g\", \"arguments\": {}}\n</tool_call>").content, "");
  EXPECT_EQ(prefilled.finish().reply.tool_calls.at(0).name, "g");
  ReplyStream no_tools(chat, plain_options);  // nothing held: the text is the reply
  EXPECT_EQ(no_tools.push("x <tool").content, "x <tool");
}

// Issue 67: a call opens once its name is written and its arguments stream as they are written,
// token by token, as the model wrote them: what streamed adds up to the reply's calls.
TEST(ReplyStream, CallArgumentsStreamAsTheyAreWritten) {
  const ChatTemplate chat(test::small_tokenizer());
  const ChatOptions offered = offering();
  const std::string text = "Checking.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Par\\\"is\", "
                           "\"n\": [1, {\"x\": true}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n"
                           "</tool_call>";
  ReplyStream s(chat, offered);
  CallsStreamed calls;
  std::vector<size_t> grew;  // argument bytes after each piece
  for (size_t at = 0; at < text.size(); ++at) {
    calls.take(s.push(text.substr(at, 1)).calls);
    grew.push_back(calls.argument_bytes);
  }
  const ReplyStream::Finish rest = s.finish();
  calls.take(rest.calls);
  ASSERT_EQ(rest.reply.tool_calls.size(), 2u);
  ASSERT_EQ(calls.calls.size(), 2u);
  EXPECT_EQ(calls.calls[0].name, "f");
  EXPECT_EQ(calls.calls[0].arguments, "{\"city\": \"Par\\\"is\", \"n\": [1, {\"x\": true}]}");
  EXPECT_EQ(rest.reply.tool_calls[0].arguments, calls.calls[0].arguments);  // as written, not re-serialised
  EXPECT_EQ(calls.calls[1].arguments, "{}");
  // The first call's arguments arrived over many pieces, not at the end.
  EXPECT_GT(std::set<size_t>(grew.begin(), grew.end()).size(), 20u);
  // A name is only sent whole: nothing opens while it is being written.
  ReplyStream naming(chat, offered);
  EXPECT_TRUE(naming.push("<tool_call>\n{\"name\": \"get_wea").calls.empty());
  const ReplyStream::Delta opened = naming.push("ther\", \"arguments\": {\"c");
  ASSERT_EQ(opened.calls.size(), 1u);
  EXPECT_EQ(opened.calls[0].name, "get_weather");
  EXPECT_EQ(opened.calls[0].arguments, "{\"c");
}

// ---------------------------------------------------------------------------------------------
// Kimi K2 and Kimi K3, against their templates.

ordered_json read_golden(const std::string& name) {
  return ordered_json::parse(read_file((test::source_dir() / "tests/data/chat" / name).string()));
}

ChatMessage message_from(const ordered_json& m) {
  ChatMessage message;
  message.role = m.at("role").get<std::string>();
  message.content = m.value("content", "");
  message.reasoning = m.value("reasoning_content", "");
  message.name = m.value("name", "");
  message.tool_call_id = m.value("tool_call_id", "");
  for (const ordered_json& call : m.value("tool_calls", ordered_json::array())) {
    const ordered_json& f = call.at("function");
    const ordered_json& args = f.at("arguments");
    message.tool_calls.push_back({f.at("name").get<std::string>(), args.is_string() ? args.get<std::string>() : args.dump(),
                                  call.value("id", "")});
  }
  return message;
}

struct Case {
  std::string name;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = false;
  ChatOptions options;
};

std::vector<std::string> functions_of(const ordered_json& cases) {
  std::vector<std::string> functions;
  for (const ordered_json& tool : cases.at("tools")) functions.push_back(tool.at("function").dump());
  return functions;
}

std::vector<Case> prompt_cases() {
  const ordered_json cases = read_golden("cases.json");
  std::vector<Case> out;
  for (const ordered_json& c : cases.at("cases")) {
    Case x;
    x.name = c.at("name").get<std::string>();
    for (const ordered_json& m : c.at("messages")) x.messages.push_back(message_from(m));
    x.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    if (c.value("with_tools", false)) x.options.tools = functions_of(cases);
    x.options.tool_choice = c.value("tool_choice", "auto");
    x.options.thinking = c.value("thinking", true);
    x.options.thinking_effort = c.value("thinking_effort", "max");
    out.push_back(std::move(x));
  }
  return out;
}

void expect_template_goldens(ChatFormat format, const std::string& golden_file) {
  const Tokenizer tok = test::kimi_tokenizer(format == ChatFormat::KimiK3);
  const ChatTemplate chat(tok);
  ASSERT_EQ(chat.format(), format);
  const ordered_json golden = read_golden(golden_file);
  for (const Case& c : prompt_cases()) {
    const std::string expected = golden.at("prompts").at(c.name).get<std::string>();
    EXPECT_EQ(chat.apply(c.messages, c.add_generation_prompt, c.options), expected) << c.name;
    const std::vector<int32_t> ids = chat.encode(c.messages, c.add_generation_prompt, c.options);
    EXPECT_EQ(tok.decode(ids), expected) << c.name;
    const bool forged = std::any_of(c.messages.begin(), c.messages.end(), [](const ChatMessage& m) {
      return m.content.find("<|im_end|>") != std::string::npos;
    });
    if (!forged) EXPECT_EQ(ids, tok.encode(expected, true)) << c.name;  // the markers are their ids, the rest text
    else EXPECT_LT(std::count(ids.begin(), ids.end(), tok.special_id("<|im_end|>")),
                   std::count_if(expected.begin(), expected.end(), [](char ch) { return ch == '<'; }));
  }
}

TEST(ChatTemplate, KimiK2PromptsAreItsTemplatesByteForByte) {
  expect_template_goldens(ChatFormat::KimiK2, "kimi-k2.json");
}

TEST(ChatTemplate, KimiK3PromptsAreItsTemplatesByteForByte) {
  expect_template_goldens(ChatFormat::KimiK3, "kimi-k3.json");
}

// The goldens' replies (what each template renders for a finished assistant message) read back,
// whole and streamed a few bytes at a time.
void expect_replies_read_back(ChatFormat format, const std::string& golden_file) {
  const ChatTemplate chat(test::small_tokenizer(), format);
  const ordered_json cases = read_golden("cases.json");
  const ordered_json golden = read_golden(golden_file);
  ChatOptions options = offering(functions_of(cases));
  for (const ordered_json& c : cases.at("replies")) {
    const std::string name = c.at("name").get<std::string>();
    const std::string text = golden.at("replies").at(name).get<std::string>();
    const ChatMessage expected = message_from(c.at("message"));
    const AssistantReply reply = chat.parse_reply(text, options);
    EXPECT_EQ(reply.content, expected.content) << name;
    EXPECT_EQ(reply.reasoning, format == ChatFormat::KimiK3 ? expected.reasoning : "") << name;
    EXPECT_FALSE(reply.malformed_call) << name;
    ASSERT_EQ(reply.tool_calls.size(), expected.tool_calls.size()) << name;
    for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
      EXPECT_EQ(reply.tool_calls[i].name, expected.tool_calls[i].name) << name;
      EXPECT_EQ(json::parse(reply.tool_calls[i].arguments), json::parse(expected.tool_calls[i].arguments)) << name;
    }
    for (size_t step : {1, 3, 7}) {
      ReplyStream stream(chat, options);
      std::string content, reasoning;
      CallsStreamed calls;
      for (size_t at = 0; at < text.size(); at += step) {
        const ReplyStream::Delta delta = stream.push(std::string_view(text).substr(at, step));
        content += delta.content;
        reasoning += delta.reasoning;
        calls.take(delta.calls);
      }
      const size_t before_the_end = calls.argument_bytes;
      const ReplyStream::Finish rest = stream.finish();
      calls.take(rest.calls);
      EXPECT_EQ(content + rest.reply.content, reply.content) << name << " in pieces of " << step;
      EXPECT_EQ(reasoning + rest.reply.reasoning, reply.reasoning) << name << " in pieces of " << step;
      // Each call opened with its name and its arguments streamed as written, adding up to the reply's.
      ASSERT_EQ(calls.calls.size(), reply.tool_calls.size()) << name << " in pieces of " << step;
      for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
        EXPECT_EQ(calls.calls[i].name, reply.tool_calls[i].name) << name;
        EXPECT_EQ(calls.calls[i].arguments, reply.tool_calls[i].arguments) << name << " in pieces of " << step;
      }
      if (!reply.tool_calls.empty()) {
        EXPECT_GT(before_the_end, 0u) << name << ": nothing streamed before the end";
      }
    }
  }
}

TEST(ChatTemplate, KimiK2RepliesAreReadBack) { expect_replies_read_back(ChatFormat::KimiK2, "kimi-k2.json"); }
TEST(ChatTemplate, KimiK3RepliesAreReadBack) { expect_replies_read_back(ChatFormat::KimiK3, "kimi-k3.json"); }

TEST(ChatTemplate, KimiBrokenCallsStayInTheContentAndForcedCallsParse) {
  const ChatOptions offered = offering();
  const ChatTemplate k2(test::small_tokenizer(), ChatFormat::KimiK2);
  AssistantReply r = k2.parse_reply("Hm.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                                    "<|tool_call_argument_begin|>{\"a\": <|tool_call_end|>", offered);
  EXPECT_TRUE(r.malformed_call);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_TRUE(r.content.starts_with("Hm.<|tool_calls_section_begin|>")) << r.content;
  // A named tool_choice: the prefix names the call, numbered after the conversation's calls.
  const std::string prefix = k2.forced_call_prefix("f", 2);
  EXPECT_EQ(prefix, "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:2<|tool_call_argument_begin|>");
  r = k2.parse_reply(prefix + "{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>", offered);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(r.content, "");

  const ChatTemplate k3(test::small_tokenizer(), ChatFormat::KimiK3);
  r = k3.parse_reply("ok<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
                     "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"a\" type=\"number\"<|sep|>x"
                     "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", offered);
  EXPECT_TRUE(r.malformed_call);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.reasoning, "ok");
  EXPECT_TRUE(r.content.starts_with("<|open|>tools<|sep|>")) << r.content;
  // "required" is said in the prompt; a forced call, named or not, is a grammar's (kimi_k3_call_grammar).
  EXPECT_EQ(k3.forced_call_prefix("", 0), "");
  EXPECT_EQ(k3.forced_call_prefix("f", 0), "");
  // Without thinking the generation prompt opened the response.
  ChatOptions direct = offered;
  direct.thinking = false;
  r = k3.parse_reply("Hi.<|close|>response<|sep|><|close|>message<|sep|>", direct);
  EXPECT_EQ(r.content, "Hi.");
  EXPECT_EQ(r.reasoning, "");
}

TEST(ChatTemplate, FormatAndTurnEndsFollowTheTokenizersMarkers) {
  const Tokenizer k2 = test::kimi_tokenizer(false), k3 = test::kimi_tokenizer(true);
  EXPECT_EQ(ChatTemplate(k2).format(), ChatFormat::KimiK2);
  EXPECT_EQ(ChatTemplate(k3).format(), ChatFormat::KimiK3);
  EXPECT_EQ(ChatTemplate(k3).end_ids(), (std::vector<int32_t>{k3.special_id("<|endoftext|>"), k3.special_id("<|end_of_msg|>")}));
  EXPECT_EQ(ChatTemplate(k2).end_ids(), (std::vector<int32_t>{k2.special_id("<|endoftext|>"), k2.special_id("<|im_end|>")}));
  ChatOptions options;
  options.thinking_effort = "medium";  // the template's own message names it, but refuses it
  test::expect_error([&] { ChatTemplate(k3).apply({}, true, options); }, "thinking_effort must be low, high or max");
  // A tool result needs a call before it to name its tool.
  const std::vector<ChatMessage> orphan = {{"tool", "5", {}, {}, {}}};
  test::expect_error([&] { ChatTemplate(k3).apply(orphan); }, "tool message 1 has no name and no call before it");
}

}  // namespace
}  // namespace hyla
