#include "hyla/serve/anthropic_api.h"

#include <fmt/format.h>

#include <set>
#include <utility>

namespace hyla {

using json = nlohmann::json;

namespace {

using api::field;
using api::invalid;

std::string type_of(const json& block, const std::string& where) {
  if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
    invalid(where, where + " must be an object with a 'type'");
  return block["type"].get<std::string>();
}

std::string text_of(const json& block, const std::string& where) {
  if (!block.contains("text") || !block["text"].is_string()) invalid(where, where + " (text) needs a string 'text'");
  return block["text"].get<std::string>();
}

// A string, or text blocks joined (system prompts, tool results).
std::string joined_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) invalid(where, where + " must be a string or an array of text blocks");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    if (type_of(content[i], at) != "text") invalid(at, fmt::format("{} is a '{}' block; only text blocks are read here",
                                                                   at, content[i]["type"].get<std::string>()));
    if (!text.empty()) text += "\n";
    text += text_of(content[i], at);
  }
  return text;
}

json image_part(const json& block, const std::string& where) {
  const json* source = field(block, "source");
  if (!source || !source->is_object() || source->value("type", json()) != "base64" ||
      !source->value("media_type", json()).is_string() || !source->value("data", json()).is_string())
    invalid(where, where + " (image) needs a 'source' of {\"type\": \"base64\", \"media_type\": ..., \"data\": ...}; "
                           "this server reads no URLs");
  return {{"type", "image_url"},
          {"image_url",
           {{"url", "data:" + (*source)["media_type"].get<std::string>() + ";base64," +
                        (*source)["data"].get<std::string>()}}}};
}

// A user turn: its tool results (each a tool message answering a call of `calls`, the ids of the
// assistant turn before it), then its text and images as one user message.
void read_user(const json& content, const std::string& where, const std::set<std::string>& calls, json& messages) {
  if (content.is_string()) {
    messages.push_back({{"role", "user"}, {"content", content}});
    return;
  }
  json parts = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    const std::string type = type_of(block, at);
    if (type == "text") {
      parts.push_back({{"type", "text"}, {"text", text_of(block, at)}});
    } else if (type == "image") {
      parts.push_back(image_part(block, at));
    } else if (type == "tool_result") {
      const json* id = field(block, "tool_use_id");
      if (!id || !id->is_string()) invalid(at + ".tool_use_id", at + " (tool_result) needs a string 'tool_use_id'");
      if (!calls.count(id->get<std::string>()))
        invalid(at + ".tool_use_id", fmt::format("{} answers tool_use '{}', which the assistant turn before it did not "
                                                 "make", at, id->get<std::string>()));
      const json* result = field(block, "content");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", *id},
                          {"content", result ? joined_text(*result, at + ".content") : std::string()}});
    } else {
      invalid(at, fmt::format("{} is a '{}' block; user turns hold text, image and tool_result blocks", at, type));
    }
  }
  if (!parts.empty()) messages.push_back({{"role", "user"}, {"content", parts}});
}

// An assistant turn; the ids of its calls are returned, for the tool results that answer them.
std::set<std::string> read_assistant(const json& content, const std::string& where, json& messages) {
  json message = {{"role", "assistant"}, {"content", ""}};
  std::set<std::string> calls;
  if (content.is_string()) {
    message["content"] = content;
    messages.push_back(std::move(message));
    return calls;
  }
  std::string text, reasoning;
  json tool_calls = json::array();
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    const std::string type = type_of(block, at);
    if (type == "text") {
      text += text_of(block, at);
    } else if (type == "thinking") {
      if (!block.value("thinking", json()).is_string()) invalid(at, at + " (thinking) needs a string 'thinking'");
      reasoning += block["thinking"].get<std::string>();
    } else if (type == "redacted_thinking") {
      continue;  // encrypted by another server: nothing this model can read
    } else if (type == "tool_use") {
      const json* id = field(block, "id");
      const json* name = field(block, "name");
      const json* input = field(block, "input");
      if (!id || !id->is_string() || !name || !name->is_string() || (input && !input->is_object()))
        invalid(at, at + " (tool_use) needs a string 'id' and 'name' and an object 'input'");
      calls.insert(id->get<std::string>());
      tool_calls.push_back({{"id", *id},
                            {"type", "function"},
                            {"function", {{"name", *name}, {"arguments", (input ? *input : json::object()).dump()}}}});
    } else {
      invalid(at, fmt::format("{} is a '{}' block; assistant turns hold text, thinking and tool_use blocks", at, type));
    }
  }
  message["content"] = text;
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) message["tool_calls"] = tool_calls;
  messages.push_back(std::move(message));
  return calls;
}

json tools_of(const json& tools) {
  if (!tools.is_array()) invalid("tools", "'tools' must be an array");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object() || !t.value("name", json()).is_string())
      invalid(at, at + " must be {\"name\": ..., \"description\": ..., \"input_schema\": {...}}");
    if (const json* type = field(t, "type"); type && *type != "custom")
      invalid(at, fmt::format("{} is a '{}' tool; this server runs none of Anthropic's own tools, only tools the "
                              "client defines", at, type->is_string() ? type->get<std::string>() : type->dump()));
    json function = {{"name", t["name"]}, {"parameters", t.value("input_schema", json::object())}};
    if (const json* description = field(t, "description")) function["description"] = *description;
    out.push_back({{"type", "function"}, {"function", function}});
  }
  return out;
}

json tool_choice_of(const json& choice) {
  const std::string type = choice.is_object() ? choice.value("type", std::string()) : "";
  if (type == "auto" || type == "none") return type;
  if (type == "any") return "required";
  if (type == "tool" && choice.value("name", json()).is_string())
    return {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
  invalid("tool_choice", "'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                         "{\"type\": \"tool\", \"name\": ...}");
}

std::string stop_reason(const json& choice) {
  const std::string finish = choice.value("finish_reason", std::string("stop"));
  if (finish == "length") return "max_tokens";
  if (finish == "tool_calls") return "tool_use";
  return choice.value("stop_reason", json()).is_string() ? "stop_sequence" : "end_turn";
}

json usage_of(const json& usage) {
  const int64_t prompt = usage.value("prompt_tokens", int64_t(0));
  const int64_t cached = usage.contains("prompt_tokens_details") ? usage["prompt_tokens_details"].value("cached_tokens", int64_t(0)) : 0;
  return {{"input_tokens", prompt - cached},
          {"output_tokens", usage.value("completion_tokens", int64_t(0))},
          {"cache_read_input_tokens", cached},
          {"cache_creation_input_tokens", 0}};
}

// A call's arguments as the object a tool_use block holds (text that is not one, under "arguments").
json input_of(const std::string& arguments) {
  json input = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : json{{"arguments", arguments}};
}

}  // namespace

json chat_body_from_messages(const json& body) {
  if (!body.is_object()) invalid("", "the request body must be a JSON object");
  json chat = json::object();
  for (const char* key : {"model", "temperature", "top_p", "top_k", "stream", "max_tokens"})
    if (const json* value = field(body, key)) chat[key] = *value;
  if (!field(body, "max_tokens")) invalid("max_tokens", "'max_tokens' is required");
  if (const json* t = field(body, "temperature"); t && t->is_number() && (t->get<double>() < 0 || t->get<double>() > 1))
    invalid("temperature", fmt::format("'temperature' must lie in [0, 1], got {}", t->dump()));
  if (const json* stop = field(body, "stop_sequences")) {
    if (!stop->is_array()) invalid("stop_sequences", "'stop_sequences' must be an array of strings");
    chat["stop"] = *stop;
  }
  json messages = json::array();
  if (const json* system = field(body, "system")) messages.push_back({{"role", "system"}, {"content", joined_text(*system, "system")}});
  const json* turns = field(body, "messages");
  if (!turns || !turns->is_array() || turns->empty()) invalid("messages", "'messages' must be a non-empty array");
  std::set<std::string> calls;  // of the assistant turn before the current one
  for (size_t i = 0; i < turns->size(); ++i) {
    const json& turn = (*turns)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!turn.is_object() || !turn.value("role", json()).is_string() || !turn.contains("content") ||
        !(turn["content"].is_string() || turn["content"].is_array()))
      invalid(at, at + " must be {\"role\": \"user\" | \"assistant\", \"content\": a string or an array of blocks}");
    const std::string role = turn["role"].get<std::string>();
    if (role == "user") {
      read_user(turn["content"], at + ".content", calls, messages);
      calls.clear();
    } else if (role == "assistant") {
      calls = read_assistant(turn["content"], at + ".content", messages);
    } else {
      invalid(at + ".role", fmt::format("{}.role must be user or assistant, got '{}'", at, role));
    }
  }
  chat["messages"] = messages;
  if (const json* tools = field(body, "tools")) chat["tools"] = tools_of(*tools);
  if (const json* choice = field(body, "tool_choice")) chat["tool_choice"] = tool_choice_of(*choice);
  if (const json* thinking = field(body, "thinking")) {
    const std::string type = thinking->is_object() ? thinking->value("type", std::string()) : "";
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      invalid("thinking", "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
    chat["chat_template_kwargs"] = {{"thinking", type != "disabled"}};
  }
  return chat;
}

json message_from_chat_response(const json& chat, const std::string& id) {
  const json& choice = chat["choices"][0];
  const json& message = choice["message"];
  json content = json::array();
  if (message.value("reasoning_content", json()).is_string() && !message["reasoning_content"].get<std::string>().empty())
    content.push_back({{"type", "thinking"}, {"thinking", message["reasoning_content"]}, {"signature", ""}});
  if (message.value("content", json()).is_string() && !message["content"].get<std::string>().empty())
    content.push_back({{"type", "text"}, {"text", message["content"]}});
  if (message.contains("tool_calls"))
    for (const json& call : message["tool_calls"])
      content.push_back({{"type", "tool_use"},
                         {"id", call["id"]},
                         {"name", call["function"]["name"]},
                         {"input", input_of(call["function"]["arguments"].get<std::string>())}});
  const std::string reason = stop_reason(choice);
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", chat["model"]},
          {"content", content},
          {"stop_reason", reason},
          {"stop_sequence", reason == "stop_sequence" ? choice["stop_reason"] : json(nullptr)},
          {"usage", usage_of(chat["usage"])}};
}

json anthropic_error(const ApiError& e) {
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status == 503 ? "overloaded_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

MessageEvents::MessageEvents(std::string id, std::string model, int64_t input_tokens)
    : id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens) {}

std::string MessageEvents::event(const char* name, const json& data) {
  return fmt::format("event: {}\ndata: {}\n\n", name, data.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string MessageEvents::open_block(const std::string& type, json block) {
  if (open_ == type && type != "tool_use") return {};
  std::string out = close_block();
  open_ = type;
  return out + event("content_block_start", {{"type", "content_block_start"}, {"index", ++index_}, {"content_block", block}});
}

std::string MessageEvents::close_block() {
  if (open_.empty()) return {};
  open_.clear();
  return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
}

std::string MessageEvents::push(const json& chunk) {
  if (chunk.contains("error")) {
    const json& e = chunk["error"];
    const bool server = e.value("type", std::string()) == "server_error";
    return event("error", anthropic_error(ApiError(server ? 500 : 400, e.value("message", std::string("error")))));
  }
  std::string out;
  if (!started_) {
    started_ = true;
    out += event("message_start", {{"type", "message_start"},
                                   {"message",
                                    {{"id", id_},
                                     {"type", "message"},
                                     {"role", "assistant"},
                                     {"model", model_},
                                     {"content", json::array()},
                                     {"stop_reason", nullptr},
                                     {"stop_sequence", nullptr},
                                     {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}}}});
  }
  if (!chunk.contains("choices") || chunk["choices"].empty()) return out;  // the usage-only chunk
  const json& choice = chunk["choices"][0];
  const json& delta = choice.value("delta", json::object());
  if (const json* r = field(delta, "reasoning_content"); r && !r->get<std::string>().empty()) {
    out += open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    out += event("content_block_delta", {{"type", "content_block_delta"},
                                         {"index", index_},
                                         {"delta", {{"type", "thinking_delta"}, {"thinking", *r}}}});
  }
  if (const json* c = field(delta, "content"); c && !c->get<std::string>().empty()) {
    out += open_block("text", {{"type", "text"}, {"text", ""}});
    out += event("content_block_delta",
                 {{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "text_delta"}, {"text", *c}}}});
  }
  if (const json* calls = field(delta, "tool_calls")) {
    for (const json& call : *calls) {
      if (call.contains("id"))  // the call opens: a tool_use block
        out += open_block("tool_use", {{"type", "tool_use"},
                                       {"id", call["id"]},
                                       {"name", call["function"]["name"]},
                                       {"input", json::object()}});
      const std::string arguments = call["function"].value("arguments", std::string());
      if (!arguments.empty())
        out += event("content_block_delta", {{"type", "content_block_delta"},
                                             {"index", index_},
                                             {"delta", {{"type", "input_json_delta"}, {"partial_json", arguments}}}});
    }
  }
  if (field(choice, "finish_reason")) {
    out += close_block();
    const std::string reason = stop_reason(choice);
    const int64_t output = chunk.contains("usage") ? chunk["usage"].value("completion_tokens", int64_t(0)) : 0;
    out += event("message_delta",
                 {{"type", "message_delta"},
                  {"delta",
                   {{"stop_reason", reason},
                    {"stop_sequence", reason == "stop_sequence" ? choice["stop_reason"] : json(nullptr)}}},
                  {"usage", {{"output_tokens", output}}}});
    out += event("message_stop", {{"type", "message_stop"}});
  }
  return out;
}

}  // namespace hyla
