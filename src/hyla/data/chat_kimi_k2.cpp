// Kimi K2's chat format, which Kimi Linear's checkpoints use (llama.cpp's
// models/templates/Kimi-K2-Instruct.jinja): "<|im_user|>user<|im_middle|>…<|im_end|>" turns with no
// newline between them, a default system turn when the conversation has none, the tools declared
// as their OpenAI JSON in a "tool_declare" turn, calls as
// "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{…}
// <|tool_call_end|>…<|tool_calls_section_end|>" numbered across the conversation, and a tool's result
// as "## Return of functions.NAME:N\n…" in a "tool" turn.
#include <deque>
#include <fmt/format.h>

#include "hyla/core/error.h"
#include "hyla/core/text.h"
#include "hyla/data/chat_formats.h"
#include "hyla/io/json_fields.h"

namespace hyla::chat {

namespace {
constexpr std::string_view kSectionBegin = "<|tool_calls_section_begin|>", kSectionEnd = "<|tool_calls_section_end|>",
                           kCallBegin = "<|tool_call_begin|>", kArgumentBegin = "<|tool_call_argument_begin|>",
                           kCallEnd = "<|tool_call_end|>", kEnd = "<|im_end|>";
constexpr std::string_view kDefaultSystem = "You are Kimi, an AI assistant created by Moonshot AI.";

// A turn's header: its role's marker, then the participant's name, or else the role.
void turn(Pieces& out, std::string_view role, std::string_view name = {}) {
  out.special(role == "user" ? "<|im_user|>" : role == "assistant" ? "<|im_assistant|>" : "<|im_system|>");
  out.text(name.empty() ? role : name);
  out.special("<|im_middle|>");
}
}  // namespace

void render_kimi_k2(std::span<const ChatMessage> messages, bool add_generation_prompt, const ChatOptions& options, Pieces& out) {
  if (!options.tools.empty()) {  // whatever tool_choice says: its template has no tool_choice
    out.special("<|im_system|>");
    out.text("tool_declare");
    out.special("<|im_middle|>");
    out.text(python_json(openai_tools(options.tools), false, false));
    out.special("<|im_end|>");
  }
  std::deque<std::string> unanswered;  // call ids, in order, for the tool turns that follow
  size_t calls = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && m.role != "system") {
      turn(out, "system");
      out.text(kDefaultSystem);
      out.special("<|im_end|>");
      out.text("\n");
    }
    turn(out, m.role, m.name);
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      out.content(m);
      out.special(kSectionBegin);
      for (const ToolCall& call : m.tool_calls) {
        unanswered.push_back(fmt::format("functions.{}:{}", call.name, calls++));
        out.special(kCallBegin);
        out.text(unanswered.back());
        out.special(kArgumentBegin);
        out.text(call.arguments);
        out.special(kCallEnd);
      }
      out.special(kSectionEnd);
    } else if (m.role == "tool") {
      std::string id = fmt::format("functions.{}:{}", m.name.empty() ? "unknown" : m.name, calls);
      if (!unanswered.empty()) {
        id = std::move(unanswered.front());
        unanswered.pop_front();
      }
      out.text("## Return of " + id + "\n");
      out.content(m);
    } else {
      out.content(m);
    }
    out.special("<|im_end|>");
  }
  if (add_generation_prompt) turn(out, "assistant");
}

AssistantReply parse_kimi_k2(std::string_view text, const ChatOptions& options, bool partial) {
  AssistantReply reply;
  if (!options.offers_tools()) {
    reply.content = text.substr(0, segment_end(text, 0, {kEnd}, partial));
    return reply;
  }
  const size_t calls_at = segment_end(text, 0, {kSectionBegin, kCallBegin, kEnd}, partial);
  reply.content = text.substr(0, calls_at);
  if (partial) {  // the calls begun: each named once its argument marker is written
    size_t at = calls_at;
    if (text.substr(at).starts_with(kSectionBegin)) at += kSectionBegin.size();
    while (text.substr(at).starts_with(kCallBegin)) {
      const size_t args_at = text.find(kArgumentBegin, at);
      if (args_at == std::string_view::npos) break;
      std::string_view id = trim_space(text.substr(at + kCallBegin.size(), args_at - at - kCallBegin.size()));
      if (id.starts_with("functions.")) id.remove_prefix(10);
      const std::string_view name = id.substr(0, id.rfind(':'));
      const size_t from = args_at + kArgumentBegin.size(), end = segment_end(text, from, {kCallEnd, kSectionEnd}, true);
      reply.tool_calls.push_back({std::string(name), std::string(trim_trailing_space(trim_space(text.substr(from, end - from))))});
      if (!text.substr(end).starts_with(kCallEnd)) break;
      at = end + kCallEnd.size();
    }
    return reply;
  }
  // The model may skip the section markers; a call's end marker may be cut off by max_tokens.
  size_t at = calls_at;
  if (text.substr(at).starts_with(kSectionBegin)) at += kSectionBegin.size();
  while (text.substr(at).starts_with(kCallBegin)) {
    const size_t id_at = at + kCallBegin.size();
    const size_t args_at = text.find(kArgumentBegin, id_at);
    if (args_at == std::string_view::npos) break;
    std::string_view id = trim_space(text.substr(id_at, args_at - id_at));
    if (id.starts_with("functions.")) id.remove_prefix(10);
    const size_t colon = id.rfind(':');
    const std::string_view name = colon == std::string_view::npos ? id : id.substr(0, colon);
    const size_t end = segment_end(text, args_at, {kCallEnd, kSectionEnd}, false);
    const std::string_view arguments = trim_space(text.substr(args_at + kArgumentBegin.size(), end - args_at - kArgumentBegin.size()));
    bool object = false;
    try {
      object = parse_json(arguments, "tool call arguments").is_object();
    } catch (const Error&) {
    }
    if (name.empty() || !object) break;
    reply.tool_calls.push_back({std::string(name), std::string(arguments)});
    at = end;
    if (text.substr(at).starts_with(kCallEnd)) at += kCallEnd.size();
  }
  if (text.substr(at).starts_with(kSectionEnd)) at += kSectionEnd.size();
  if (text.substr(at).starts_with(kEnd)) at += kEnd.size();
  if (at < text.size()) {  // a call that does not parse, or text after the calls: left for the reader
    reply.content += text.substr(calls_at);
    reply.tool_calls.clear();
    reply.malformed_call = true;
  }
  return reply;
}

}  // namespace hyla::chat
