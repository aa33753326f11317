#include "hyla/data/chat_template.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hyla/core/error.h"
#include "hyla/core/text.h"
#include "hyla/data/image_text.h"
#include "hyla/io/json_fields.h"

namespace hyla {

namespace {
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";
constexpr std::string_view kResponseOpen = "<tool_response>", kResponseClose = "</tool_response>";

// A call's JSON body: name first, then the arguments exactly as given.
std::string call_body(const ToolCall& call) {
  return "{\"name\": " + nlohmann::json(call.name).dump() + ", \"arguments\": " + call.arguments + "}";
}
}  // namespace

std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string text;
  for (const ChatMessage& m : messages) {
    text += "<|im_start|>" + m.role + "\n";
    if (m.role == "tool") {
      text += std::string(kResponseOpen) + "\n" + m.content + "\n" + std::string(kResponseClose);
    } else {
      text += m.content;
      for (const ToolCall& call : m.tool_calls)
        text += fmt::format("{}{}\n{}\n{}", text.back() == '\n' ? "" : "\n", kCallOpen, call_body(call), kCallClose);
    }
    text += "<|im_end|>\n";
  }
  if (add_generation_prompt) text += "<|im_start|>assistant\n";
  return text;
}

std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                 bool add_generation_prompt, int64_t patch_size) {
  const int32_t start = tokenizer.special_id("<|im_start|>"), end = tokenizer.special_id("<|im_end|>");
  std::vector<int32_t> ids;
  for (const ChatMessage& m : messages) {
    ids.push_back(start);
    if (m.role == "tool") {
      tokenizer.encode_append(m.role + "\n", false, ids);
      ids.push_back(tokenizer.special_id(kResponseOpen));
      tokenizer.encode_append("\n" + m.content + "\n", false, ids);
      ids.push_back(tokenizer.special_id(kResponseClose));
    } else {
      std::string text = m.role + "\n";
      size_t from = 0;
      for (const ChatImage& image : m.images) {
        HYLA_ASSERT(image.at >= from && image.at <= m.content.size() && patch_size > 0);
        text += m.content.substr(from, image.at - from);
        tokenizer.encode_append(text, false, ids);
        text.clear();
        append_image_span(tokenizer, image.image, patch_size, ids);
        from = image.at;
      }
      text += m.content.substr(from);
      for (const ToolCall& call : m.tool_calls) {
        if (text.empty() || text.back() != '\n') text += "\n";
        tokenizer.encode_append(text, false, ids);
        ids.push_back(tokenizer.special_id(kCallOpen));
        tokenizer.encode_append(fmt::format("\n{}\n", call_body(call)), false, ids);
        ids.push_back(tokenizer.special_id(kCallClose));
        text.clear();
      }
      tokenizer.encode_append(text, false, ids);
    }
    ids.push_back(end);
    tokenizer.encode_append("\n", false, ids);
  }
  if (add_generation_prompt) {
    ids.push_back(start);
    tokenizer.encode_append("assistant\n", false, ids);
  }
  return ids;
}

std::vector<Image> chat_images(std::span<const ChatMessage> messages) {
  std::vector<Image> images;
  for (const ChatMessage& m : messages)
    for (const ChatImage& image : m.images) images.push_back(image.image);
  return images;
}

std::string tools_system_prompt(std::span<const std::string> functions) {
  std::string text =
      "# Tools\n\nYou may call one or more functions to assist with the user query. The available functions are "
      "listed inside <tools></tools>:\n<tools>\n";
  for (const std::string& f : functions) text += f + "\n";
  text +=
      "</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments inside "
      "<tool_call></tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
      "</tool_call>";
  return text;
}

std::vector<ChatMessage> with_tools(std::span<const ChatMessage> messages, std::span<const std::string> functions) {
  std::vector<ChatMessage> out(messages.begin(), messages.end());
  const std::string offer = tools_system_prompt(functions);
  if (!out.empty() && out.front().role == "system") out.front().content += "\n\n" + offer;
  else out.insert(out.begin(), ChatMessage{"system", offer, {}});
  return out;
}

AssistantReply parse_assistant_reply(std::string_view text) {
  AssistantReply reply;
  std::string content;
  size_t at = 0;
  for (;;) {
    const size_t open = text.find(kCallOpen, at);
    if (open == std::string_view::npos) break;
    const size_t body = open + kCallOpen.size();
    const size_t close = text.find(kCallClose, body);
    // A block the model did not close (e.g. cut off by max_tokens) is parsed up to the end.
    const std::string_view inner = trim_space(text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body));
    nlohmann::json j;
    try {
      j = parse_json(inner, "tool call");
    } catch (const Error&) {
      // not a call: stays text
    }
    const size_t next = close == std::string_view::npos ? text.size() : close + kCallClose.size();
    if (j.is_object() && j.contains("name") && j["name"].is_string()) {
      content += text.substr(at, open - at);
      const auto args = j.find("arguments");
      reply.tool_calls.push_back({j["name"].get<std::string>(),
                                  args == j.end() ? "{}" : args->is_string() ? args->get<std::string>() : args->dump()});
    } else {
      content += text.substr(at, next - at);
    }
    at = next;
  }
  content += text.substr(std::min(at, text.size()));
  reply.content = reply.tool_calls.empty() ? std::string(text) : std::string(trim_space(content));
  return reply;
}

}  // namespace hyla
