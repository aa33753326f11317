#include "hyla/data/chat_template.h"

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <optional>

#include "hyla/core/error.h"
#include "hyla/core/text.h"
#include "hyla/data/chat_formats.h"
#include "hyla/data/image_text.h"
#include "hyla/io/json_fields.h"

namespace hyla {

namespace chat {

void Pieces::text(std::string_view s) {
  if (!s.empty()) list_.push_back({Piece::Kind::Text, std::string(s), nullptr});
}

void Pieces::special(std::string_view token) { list_.push_back({Piece::Kind::Special, std::string(token), nullptr}); }

void Pieces::content(const ChatMessage& message) {
  size_t from = 0;
  for (const ChatImage& image : message.images) {
    HYLA_ASSERT(image.at >= from && image.at <= message.content.size());
    text(std::string_view(message.content).substr(from, image.at - from));
    list_.push_back({Piece::Kind::Image, {}, &image.image});
    from = image.at;
  }
  text(std::string_view(message.content).substr(from));
}

bool Pieces::ends_with(char c) const {
  return !list_.empty() && list_.back().kind == Piece::Kind::Text && list_.back().text.back() == c;
}

size_t segment_end(std::string_view text, size_t from, std::initializer_list<std::string_view> delimiters, bool partial) {
  size_t end = std::string_view::npos;
  for (std::string_view d : delimiters) end = std::min(end, text.find(d, from));
  if (end != std::string_view::npos) return end;
  if (!partial) return text.size();
  for (size_t n = std::min(text.size() - from, size_t(64)); n > 0; --n)
    for (std::string_view d : delimiters)
      if (n < d.size() && text.substr(text.size() - n) == d.substr(0, n)) return text.size() - n;
  return text.size();
}

size_t json_value_end(std::string_view t, size_t i) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < t.size() && space(t[i])) ++i;
  if (i >= t.size()) return std::string_view::npos;
  if (t[i] != '{' && t[i] != '[' && t[i] != '"') {
    while (i < t.size() && !space(t[i]) && t[i] != ',' && t[i] != '}' && t[i] != ']') ++i;
    return i < t.size() ? i : std::string_view::npos;
  }
  int depth = 0;
  bool in_string = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
        if (depth == 0) return i + 1;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

std::string_view trim_trailing_space(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\n' || text.back() == '\r'))
    text.remove_suffix(1);
  return text;
}

std::string python_json(const nlohmann::ordered_json& value, bool compact, bool sort_keys) {
  const char* comma = compact ? "," : ", ";
  if (value.is_object()) {
    std::vector<const std::string*> keys;
    for (const auto& [key, item] : value.items()) keys.push_back(&key);
    // UTF-8's byte order is its code points' order, which is Python's string order.
    if (sort_keys) std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    std::string out = "{";
    for (size_t i = 0; i < keys.size(); ++i)
      out += (i ? comma : "") + nlohmann::ordered_json(*keys[i]).dump() + (compact ? ":" : ": ") +
             python_json(value.at(*keys[i]), compact, sort_keys);
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? comma : "") + python_json(value[i], compact, sort_keys);
    return out + "]";
  }
  return value.dump();
}

nlohmann::ordered_json openai_tools(std::span<const std::string> functions) {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  for (const std::string& f : functions)
    tools.push_back({{"type", "function"}, {"function", nlohmann::ordered_json::parse(f)}});
  return tools;
}

namespace {

constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

// A call's JSON body: name first, then the arguments exactly as given.
std::string call_body(const ToolCall& call) {
  return "{\"name\": " + nlohmann::json(call.name).dump() + ", \"arguments\": " + call.arguments + "}";
}

// "name(a, b, c?): description" per tool: the required arguments in their "required" order (the
// schema's properties object may come sorted), then the optional ones marked "?".
std::string compact_tools_prompt(std::span<const std::string> functions) {
  std::string text = "Tools; call one as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>:";
  for (const std::string& f : functions) {
    const nlohmann::ordered_json definition = nlohmann::ordered_json::parse(f);
    std::vector<std::string> arguments;
    const nlohmann::ordered_json parameters = definition.value("parameters", nlohmann::ordered_json::object());
    if (parameters.contains("required"))
      for (const auto& name : parameters["required"]) arguments.push_back(name.get<std::string>());
    if (parameters.contains("properties"))
      for (const auto& [name, schema] : parameters["properties"].items())
        if (std::find(arguments.begin(), arguments.end(), name) == arguments.end()) arguments.push_back(name + "?");
    text += "\n" + definition.value("name", std::string()) + fmt::format("({}): ", fmt::join(arguments, ", ")) +
            definition.value("description", std::string());
  }
  return text;
}

std::string tools_system_prompt(std::span<const std::string> functions, bool compact) {
  if (compact) return compact_tools_prompt(functions);
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

}  // namespace

void render_hyla(std::span<const ChatMessage> messages, bool add_generation_prompt, const ChatOptions& options, Pieces& out) {
  // Offered tools join a leading system message, or make one.
  std::vector<ChatMessage> offered;
  if (options.offers_tools()) {
    offered.assign(messages.begin(), messages.end());
    const std::string offer = tools_system_prompt(options.tools, options.compact_tools);
    if (!offered.empty() && offered.front().role == "system") offered.front().content += "\n\n" + offer;
    else offered.insert(offered.begin(), ChatMessage{"system", offer, {}, {}, {}});
    messages = offered;
  }
  for (const ChatMessage& m : messages) {
    out.special("<|im_start|>");
    if (m.role == "tool") {
      out.text(m.role + "\n");
      out.special("<tool_response>");
      out.text("\n" + m.content + "\n");
      out.special("</tool_response>");
    } else {
      out.text(m.role + "\n");
      out.content(m);
      for (const ToolCall& call : m.tool_calls) {
        if (!out.ends_with('\n')) out.text("\n");
        out.special(kCallOpen);
        out.text(fmt::format("\n{}\n", call_body(call)));
        out.special(kCallClose);
      }
    }
    out.special("<|im_end|>");
    out.text("\n");
  }
  if (add_generation_prompt) {
    out.special("<|im_start|>");
    out.text("assistant\n");
  }
}

// A call block's JSON body as far as it is written: the tool's name once its string is complete,
// and the text of "arguments" (an object, as the model wrote it) so far. Read member by member,
// so that each reading of a longer body extends the one before; nullopt before the name.
std::optional<ToolCall> call_so_far(std::string_view body) {
  size_t i = body.find_first_not_of(" \t\r\n");
  if (i == std::string_view::npos || body[i] != '{') return std::nullopt;
  std::optional<std::string> name;
  std::string arguments;
  for (++i;;) {
    i = body.find_first_not_of(" \t\r\n,", i);
    if (i == std::string_view::npos || body[i] != '"') break;
    const size_t key_end = json_value_end(body, i);
    if (key_end == std::string_view::npos) break;
    const nlohmann::json key = nlohmann::json::parse(body.substr(i, key_end - i), nullptr, false);
    i = body.find_first_not_of(" \t\r\n", key_end);
    if (i == std::string_view::npos || body[i] != ':') break;
    const size_t value_at = body.find_first_not_of(" \t\r\n", i + 1);
    if (value_at == std::string_view::npos) break;
    const size_t value_end = json_value_end(body, value_at);
    const std::string_view value = body.substr(value_at, value_end == std::string_view::npos ? value_end : value_end - value_at);
    if (key == "name" && value_end != std::string_view::npos) {
      const nlohmann::json n = nlohmann::json::parse(value, nullptr, false);
      if (n.is_string()) name = n.get<std::string>();
    } else if (key == "arguments" && body[value_at] == '{') {
      arguments = trim_trailing_space(value);
    }
    if (value_end == std::string_view::npos) break;
    i = value_end;
  }
  if (!name) return std::nullopt;
  return ToolCall{*name, std::move(arguments)};
}

AssistantReply parse_hyla(std::string_view text, const ChatOptions& options, bool partial) {
  AssistantReply reply;
  if (!options.offers_tools()) {
    reply.content = text;
    return reply;
  }
  if (partial) {
    size_t at = segment_end(text, 0, {kCallOpen}, true);
    reply.content = text.substr(0, at);
    while (text.substr(at).starts_with(kCallOpen)) {
      const size_t body = at + kCallOpen.size(), close = text.find(kCallClose, body);
      std::optional<ToolCall> call = call_so_far(text.substr(body, close == std::string_view::npos ? close : close - body));
      if (!call) break;
      reply.tool_calls.push_back(std::move(*call));
      if (close == std::string_view::npos) break;
      at = text.find_first_not_of(" \t\r\n", close + kCallClose.size());
      if (at == std::string_view::npos) break;
    }
    return reply;
  }
  std::string content;
  size_t at = 0;
  for (;;) {
    const size_t open = text.find(kCallOpen, at);
    if (open == std::string_view::npos) break;
    const size_t body = open + kCallOpen.size();
    const size_t close = text.find(kCallClose, body);
    // A block the model did not close (e.g. cut off by max_tokens) is parsed up to the end.
    const std::string_view inner = trim_space(text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body));
    // In the model's own key order (a reply's arguments read back as it wrote them); not JSON:
    // not a call, it stays text.
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(inner, nullptr, /*allow_exceptions=*/false);
    const size_t next = close == std::string_view::npos ? text.size() : close + kCallClose.size();
    if (j.is_object() && j.contains("name") && j["name"].is_string()) {
      content += text.substr(at, open - at);
      // Arguments as the model wrote them (what streaming sent, call_so_far); a string is its text.
      const auto args = j.find("arguments");
      const std::optional<ToolCall> written = call_so_far(inner);
      reply.tool_calls.push_back({j["name"].get<std::string>(),
                                  args == j.end()        ? "{}"
                                  : args->is_string()    ? args->get<std::string>()
                                  : args->is_object() && written ? written->arguments
                                                         : args->dump()});
    } else {
      content += text.substr(at, next - at);
    }
    at = next;
  }
  content += text.substr(std::min(at, text.size()));
  reply.content = reply.tool_calls.empty() ? std::string(text) : std::string(trim_space(content));
  reply.malformed_call = reply.content.find(kCallOpen) != std::string::npos;
  return reply;
}

}  // namespace chat

std::string_view to_string(ChatFormat format) {
  switch (format) {
    case ChatFormat::Hyla: return "hyla";
    case ChatFormat::KimiK2: return "kimi-k2";
    case ChatFormat::KimiK3: return "kimi-k3";
  }
  return "?";
}

namespace {

bool has_specials(const Tokenizer& tokenizer, std::initializer_list<std::string_view> tokens) {
  return std::all_of(tokens.begin(), tokens.end(), [&](std::string_view t) {
    const std::optional<int32_t> id = tokenizer.token_id(t);
    return id && tokenizer.is_special(*id);
  });
}

ChatFormat format_of(const Tokenizer& tokenizer) {
  if (has_specials(tokenizer, {"<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"})) return ChatFormat::KimiK3;
  if (has_specials(tokenizer, {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"}))
    return ChatFormat::KimiK2;
  return ChatFormat::Hyla;
}

std::vector<chat::Piece> render(ChatFormat format, std::span<const ChatMessage> messages, bool add_generation_prompt,
                                const ChatOptions& options) {
  chat::Pieces pieces;
  switch (format) {
    case ChatFormat::Hyla: chat::render_hyla(messages, add_generation_prompt, options, pieces); break;
    case ChatFormat::KimiK2: chat::render_kimi_k2(messages, add_generation_prompt, options, pieces); break;
    case ChatFormat::KimiK3: chat::render_kimi_k3(messages, add_generation_prompt, options, pieces); break;
  }
  return std::move(pieces.list());
}

}  // namespace

ChatTemplate::ChatTemplate(Tokenizer tokenizer) : ChatTemplate(tokenizer, format_of(tokenizer)) {}

ChatTemplate::ChatTemplate(Tokenizer tokenizer, ChatFormat format) : tokenizer_(std::move(tokenizer)), format_(format) {}

std::string ChatTemplate::apply(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                const ChatOptions& options) const {
  std::string text;
  for (const chat::Piece& piece : render(format_, messages, add_generation_prompt, options)) text += piece.text;
  return text;
}

std::vector<int32_t> ChatTemplate::encode(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                          const ChatOptions& options, int64_t patch_size) const {
  std::vector<int32_t> ids;
  std::string text;  // consecutive text pieces are encoded as one
  for (const chat::Piece& piece : render(format_, messages, add_generation_prompt, options)) {
    if (piece.kind == chat::Piece::Kind::Text) {
      text += piece.text;
      continue;
    }
    tokenizer_.encode_append(text, false, ids);
    text.clear();
    if (piece.kind == chat::Piece::Kind::Special) {
      ids.push_back(tokenizer_.special_id(piece.text));
    } else if (format_ == ChatFormat::KimiK3) {
      HYLA_ASSERT(patch_size > 0);
      const Image& img = *piece.image;
      ids.push_back(tokenizer_.special_id("<|media_begin|>"));
      tokenizer_.encode_append(fmt::format("image {}x{}", img.source_width ? img.source_width : img.width,
                                           img.source_height ? img.source_height : img.height),
                               false, ids);
      ids.push_back(tokenizer_.special_id("<|media_content|>"));
      ids.insert(ids.end(), size_t((img.height / patch_size) * (img.width / patch_size)),
                 tokenizer_.special_id("<|media_pad|>"));
      ids.push_back(tokenizer_.special_id("<|media_end|>"));
    } else {
      HYLA_ASSERT(patch_size > 0);
      append_image_span(tokenizer_, *piece.image, patch_size, ids);
    }
  }
  tokenizer_.encode_append(text, false, ids);
  return ids;
}

AssistantReply ChatTemplate::parse_reply(std::string_view text, const ChatOptions& options, bool partial) const {
  switch (format_) {
    case ChatFormat::Hyla: return chat::parse_hyla(text, options, partial);
    case ChatFormat::KimiK2: return chat::parse_kimi_k2(text, options, partial);
    case ChatFormat::KimiK3: return chat::parse_kimi_k3(text, options, partial);
  }
  return {};
}

std::string ChatTemplate::forced_call_prefix(std::string_view tool_name, size_t previous_calls) const {
  switch (format_) {
    case ChatFormat::Hyla:
      return tool_name.empty() ? "<tool_call>\n"
                               : "<tool_call>\n{\"name\": " + nlohmann::json(tool_name).dump() + ", \"arguments\": ";
    case ChatFormat::KimiK2:
      return "<|tool_calls_section_begin|><|tool_call_begin|>" +
             (tool_name.empty() ? std::string()
                                : fmt::format("functions.{}:{}<|tool_call_argument_begin|>", tool_name, previous_calls));
    case ChatFormat::KimiK3:
      // The call follows the think channel, so no prefix can force it: a grammar does
      // (kimi_k3_call_grammar), from the think channel on.
      return {};
  }
  return {};
}

std::vector<int32_t> ChatTemplate::end_ids() const {
  std::vector<int32_t> ids;
  for (const char* name : {"<|endoftext|>", format_ == ChatFormat::KimiK3 ? "<|end_of_msg|>" : "<|im_end|>"})
    if (const std::optional<int32_t> id = tokenizer_.token_id(name)) ids.push_back(*id);
  return ids;
}

std::vector<Image> chat_images(std::span<const ChatMessage> messages) {
  std::vector<Image> images;
  for (const ChatMessage& m : messages)
    for (const ChatImage& image : m.images) images.push_back(image.image);
  return images;
}

}  // namespace hyla
