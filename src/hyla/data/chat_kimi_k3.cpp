// Kimi K3's chat format, XTML (llama.cpp's models/templates/Kimi-K3.jinja): each message is
// <|open|>message role="…"<|sep|>…<|close|>message<|sep|><|end_of_msg|>, where <|open|>, <|sep|>,
// <|close|> and <|end_of_msg|> are marker tokens and tag names and attributes are text. An
// assistant message holds a think channel (when thinking), a response and a tools section of calls
// whose arguments are one tagged value per key (as the official renderer writes a JSON object, and
// llama.cpp after parsing OpenAI's argument text), or one JSON block for text that is no object.
// Tools are declared with keys sorted by code point (the reference's json.dumps(sort_keys=True))
// in a leading system message, the thinking effort in the next. A message's `name` is an
// attribute; tool results are named and ordered by the calls their tool_call_ids answer.
#include <fmt/format.h>

#include "hyla/core/error.h"
#include "hyla/core/text.h"
#include "hyla/data/chat_formats.h"
#include "hyla/io/json_fields.h"

namespace hyla::chat {

namespace {

constexpr std::string_view kOpen = "<|open|>", kSep = "<|sep|>", kClose = "<|close|>", kEndOfMessage = "<|end_of_msg|>";
const std::string kThinkEnd = "<|close|>think<|sep|>", kResponseStart = "<|open|>response<|sep|>",
                  kResponseEnd = "<|close|>response<|sep|>", kToolsStart = "<|open|>tools<|sep|>",
                  kToolsEnd = "<|close|>tools<|sep|>", kMessageEnd = "<|close|>message<|sep|>",
                  kCallEnd = "<|close|>call<|sep|>";

std::string escape_attribute(std::string_view value) {
  std::string out;
  for (const char c : value) out += c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  return out;
}

std::string unescape_attribute(std::string_view value) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value.substr(i).starts_with("&quot;")) out += '"', i += 5;
    else if (value.substr(i).starts_with("&amp;")) out += '&', i += 4;
    else out += value[i];
  }
  return out;
}

using Attributes = std::vector<std::pair<std::string_view, std::string>>;

void open_tag(Pieces& out, std::string_view tag, const Attributes& attributes = {}) {
  std::string text(tag);
  for (const auto& [key, value] : attributes) text += fmt::format(" {}=\"{}\"", key, escape_attribute(value));
  out.special(kOpen);
  out.text(text);
  out.special(kSep);
}

void close_tag(Pieces& out, std::string_view tag) {
  out.special(kClose);
  out.text(tag);
  out.special(kSep);
}

void end_message(Pieces& out) {
  close_tag(out, "message");
  out.special(kEndOfMessage);
}

void system_message(Pieces& out, std::string_view type, std::string_view body) {
  open_tag(out, "message", {{"role", "system"}, {"type", std::string(type)}});
  out.text(trim_space(body));
  end_message(out);
}

// A call's arguments as the official renderer (and llama.cpp, which parses OpenAI's argument text
// before rendering) sees them: a JSON object, one tagged value per key in its order.
std::optional<nlohmann::ordered_json> json_object(std::string_view arguments) {
  nlohmann::ordered_json value = nlohmann::ordered_json::parse(arguments, nullptr, false);
  if (value.is_discarded() || !value.is_object()) return std::nullopt;
  return value;
}

const char* xtml_type(const nlohmann::ordered_json& value) {
  if (value.is_boolean()) return "boolean";
  if (value.is_null()) return "null";
  if (value.is_number()) return "number";
  if (value.is_string()) return "string";
  return value.is_object() ? "object" : "array";
}

void assistant_body(Pieces& out, const ChatMessage& m, bool thinking) {
  if (thinking) {
    open_tag(out, "think");
    if (!trim_space(m.reasoning).empty()) out.text(m.reasoning);
    close_tag(out, "think");
  }
  open_tag(out, "response");
  out.content(m);
  close_tag(out, "response");
  if (m.tool_calls.empty()) return;
  open_tag(out, "tools");
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ToolCall& call = m.tool_calls[i];
    open_tag(out, "call", {{"tool", call.name}, {"index", std::to_string(i + 1)}});
    if (const std::optional<nlohmann::ordered_json> object = json_object(call.arguments)) {
      for (const auto& [key, value] : object->items()) {
        open_tag(out, "argument", {{"key", key}, {"type", xtml_type(value)}});
        out.text(value.is_string() ? value.get<std::string>() : python_json(value, false, false));
        close_tag(out, "argument");
      }
    } else if (!trim_space(call.arguments).empty()) {  // text that is no JSON object: the template's JSON block
      open_tag(out, "json", {{"type", "object"}});
      out.text(call.arguments);
      close_tag(out, "json");
    }
    close_tag(out, "call");
  }
  close_tag(out, "tools");
}

void tool_result(Pieces& out, const ChatMessage& m, std::string_view tool, size_t& answered) {
  open_tag(out, "message", {{"role", "tool"}, {"tool", std::string(tool)}, {"index", std::to_string(++answered)}});
  out.content(m);
  end_message(out);
}

// A run of tool messages, numbered on from `answered` (the results since the last assistant turn).
// When every one answers a call of that turn by id, they follow the calls' order, each named by
// its call; otherwise they keep their order, each named by its own `name`, else by the call at its
// position.
void tool_results(Pieces& out, std::span<const ChatMessage> run, const std::vector<ToolCall>* calls, size_t& answered) {
  const auto call_with_id = [&](const std::string& id) -> const ToolCall* {
    if (!calls || id.empty()) return nullptr;
    for (const ToolCall& call : *calls)
      if (call.id == id) return &call;
    return nullptr;
  };
  if (std::all_of(run.begin(), run.end(), [&](const ChatMessage& m) { return call_with_id(m.tool_call_id); })) {
    for (size_t c = 0; c < calls->size(); ++c) {
      const ToolCall& call = (*calls)[c];
      if (call.id.empty() || call_with_id(call.id) != &call) continue;  // each id once, at its first call
      for (const ChatMessage& m : run)
        if (m.tool_call_id == call.id) tool_result(out, m, call.name, answered);
    }
    return;
  }
  for (const ChatMessage& m : run) {
    const std::string* tool = !m.name.empty() ? &m.name : calls && answered < calls->size() ? &(*calls)[answered].name : nullptr;
    HYLA_CHECK(tool, "Kimi K3: tool message {} has no name and no call before it to name its tool", answered + 1);
    tool_result(out, m, *tool, answered);
  }
}

}  // namespace

void render_kimi_k3(std::span<const ChatMessage> messages, bool add_generation_prompt, const ChatOptions& options, Pieces& out) {
  const std::string& effort = options.thinking_effort;
  HYLA_CHECK(!options.thinking || effort.empty() || effort == "low" || effort == "high" || effort == "max",
             "Kimi K3: thinking_effort must be low, high or max, got '{}'", effort);
  if (!options.tools.empty()) {
    open_tag(out, "message", {{"role", "system"}, {"type", "tool-declare"}});
    out.text("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
             python_json(openai_tools(options.tools), true, true) + "\n```");
    end_message(out);
  }
  if (options.thinking && !effort.empty())
    system_message(out, "thinking-effort",
                   "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
                   "channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked "
                   "with `thinking_effort=" + effort + "`.");
  const std::vector<ToolCall>* calls = nullptr;  // the last assistant's: they name the tool turns after it
  size_t answered = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      size_t end = i;
      while (end < messages.size() && messages[end].role == "tool") ++end;
      tool_results(out, messages.subspan(i, end - i), calls, answered);
      i = end - 1;
      continue;
    }
    Attributes attributes = {{"role", m.role}};
    if (!m.name.empty()) attributes.emplace_back("name", m.name);
    open_tag(out, "message", attributes);
    if (m.role == "assistant") {
      calls = &m.tool_calls;
      answered = 0;
      assistant_body(out, m, options.thinking);
    } else {
      out.content(m);
    }
    end_message(out);
  }
  if (!options.tools.empty() && options.tool_choice == "required")
    system_message(out, "tool-choice", "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  if (!options.tools.empty() && options.tool_choice == "none")
    system_message(out, "tool-choice", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
  if (add_generation_prompt) {
    open_tag(out, "message", {{"role", "assistant"}});
    open_tag(out, options.thinking ? "think" : "response");
  }
}

namespace {

// `<|open|>tag k="v" …<|sep|>` at `at`: the tag and its attributes, `at` moved past it.
struct Tag {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attributes;
  const std::string* find(std::string_view key) const {
    for (const auto& [k, v] : attributes)
      if (k == key) return &v;
    return nullptr;
  }
};

std::optional<Tag> read_open_tag(std::string_view text, size_t& at) {
  if (!text.substr(at).starts_with(kOpen)) return std::nullopt;
  const size_t end = text.find(kSep, at);
  if (end == std::string_view::npos) return std::nullopt;
  std::string_view inside = text.substr(at + kOpen.size(), end - at - kOpen.size());
  Tag tag;
  const size_t space = inside.find(' ');
  tag.name = inside.substr(0, space);
  inside = space == std::string_view::npos ? std::string_view() : inside.substr(space);
  while (!(inside = trim_space(inside)).empty()) {
    const size_t eq = inside.find("=\"");
    const size_t quote = eq == std::string_view::npos ? eq : inside.find('"', eq + 2);
    if (quote == std::string_view::npos) return std::nullopt;
    tag.attributes.emplace_back(std::string(inside.substr(0, eq)), unescape_attribute(inside.substr(eq + 2, quote - eq - 2)));
    inside.remove_prefix(quote + 1);
  }
  at = end + kSep.size();
  return tag;
}

bool skip(std::string_view text, size_t& at, std::string_view marker) {
  if (!text.substr(at).starts_with(marker)) return false;
  at += marker.size();
  return true;
}

// One call at `at` (after its open tag was read): its arguments, `at` moved past its close tag.
std::optional<std::string> read_call_arguments(std::string_view text, size_t& at) {
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
  std::optional<std::string> block;
  while (!skip(text, at, kCallEnd)) {
    const std::optional<Tag> tag = read_open_tag(text, at);
    if (!tag || (tag->name != "argument" && tag->name != "json")) return std::nullopt;
    const std::string close = fmt::format("{}{}{}", kClose, tag->name, kSep);
    const size_t end = text.find(close, at);
    if (end == std::string_view::npos) return std::nullopt;
    const std::string_view value = text.substr(at, end - at);
    at = end + close.size();
    try {
      if (tag->name == "json") {
        if (block || !parse_json(value, "tool call arguments").is_object()) return std::nullopt;
        block = std::string(trim_space(value));
        continue;
      }
      const std::string* key = tag->find("key");
      const std::string* type = tag->find("type");
      if (!key) return std::nullopt;
      arguments[*key] = type && *type == "string" ? nlohmann::ordered_json(std::string(value))
                                                  : nlohmann::ordered_json::parse(value);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (block) return arguments.empty() ? block : std::nullopt;
  return arguments.dump();
}

// The calls begun at `at` (after the content) of a reply still being written: each named once its
// open tag is complete, its arguments the JSON text read_call_arguments builds, as far as the
// arguments written allow: every finished one, and a string one's text so far. Each reading of a
// longer reply extends the one before.
void calls_so_far(std::string_view text, size_t at, std::vector<ToolCall>& calls) {
  skip(text, at, kResponseEnd);
  if (!skip(text, at, kToolsStart)) return;
  for (;;) {
    const std::optional<Tag> call = read_open_tag(text, at);
    const std::string* tool = call && call->name == "call" ? call->find("tool") : nullptr;
    if (!tool) return;
    std::string arguments = "{";
    bool complete = false;
    for (size_t written = 0;; ++written) {
      if (skip(text, at, kCallEnd)) {
        complete = true;
        break;
      }
      const std::optional<Tag> tag = read_open_tag(text, at);
      const std::string* key = tag && tag->name == "argument" ? tag->find("key") : nullptr;
      if (!key) break;  // unfinished, or a json block (sent whole at the end)
      const std::string* type = tag->find("type");
      const bool is_string = type && *type == "string";
      const std::string close = fmt::format("{}argument{}", kClose, kSep);
      const size_t end = text.find(close, at);
      const std::string_view value = text.substr(at, end == std::string_view::npos ? end : end - at);
      const std::string head = (written ? "," : "") + nlohmann::json(*key).dump() + ":";
      const auto dump = [](const nlohmann::ordered_json& v) {
        return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      };
      if (end == std::string_view::npos) {
        if (is_string) {  // its text so far, as a JSON string without its closing quote
          const std::string quoted = dump(std::string(text.substr(at, segment_end(text, at, {close}, true) - at)));
          arguments += head + quoted.substr(0, quoted.size() - 1);
        }
        break;
      }
      const nlohmann::ordered_json parsed =
          is_string ? nlohmann::ordered_json(std::string(value)) : nlohmann::ordered_json::parse(value, nullptr, false);
      if (parsed.is_discarded()) break;
      arguments += head + dump(parsed);
      at = end + close.size();
    }
    calls.push_back({*tool, complete ? arguments + "}" : arguments});
    if (!complete) return;
  }
}

}  // namespace

AssistantReply parse_kimi_k3(std::string_view text, const ChatOptions& options, bool partial) {
  AssistantReply reply;
  size_t at = 0;
  if (options.thinking) {  // the generation prompt opened the think channel
    const size_t end = segment_end(text, at, {kThinkEnd, kResponseStart}, partial);
    reply.reasoning = text.substr(at, end - at);
    at = end;
    // Still thinking (or a held tail that may close the channel): no content yet.
    if (!skip(text, at, kThinkEnd) && !text.substr(at).starts_with(kResponseStart) && partial) return reply;
  }
  if (partial && std::string_view(kResponseStart).starts_with(text.substr(at))) return reply;  // the opener, unfinished
  skip(text, at, kResponseStart);
  const size_t end = segment_end(text, at, {kResponseEnd, kToolsStart, kMessageEnd}, partial);
  reply.content = text.substr(at, end - at);
  at = end;
  if (partial) {
    if (options.offers_tools()) calls_so_far(text, at, reply.tool_calls);
    return reply;
  }
  skip(text, at, kResponseEnd);
  const size_t tools_at = at;
  if (options.offers_tools() && skip(text, at, kToolsStart)) {
    for (;;) {
      size_t call_at = at;
      const std::optional<Tag> tag = read_open_tag(text, call_at);
      const std::string* tool = tag && tag->name == "call" ? tag->find("tool") : nullptr;
      if (!tool) break;
      std::optional<std::string> arguments = read_call_arguments(text, call_at);
      if (!arguments) break;
      reply.tool_calls.push_back({*tool, std::move(*arguments)});
      at = call_at;
    }
    skip(text, at, kToolsEnd);
  }
  skip(text, at, kMessageEnd);
  skip(text, at, kEndOfMessage);
  if (at < text.size()) {  // a call that does not parse, or text after the message: left for the reader
    reply.content += text.substr(tools_at);
    reply.malformed_call = !reply.tool_calls.empty() || text.substr(tools_at).starts_with(kToolsStart);
    reply.tool_calls.clear();
  }
  return reply;
}

}  // namespace hyla::chat
