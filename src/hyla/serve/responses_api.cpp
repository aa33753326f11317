#include "hyla/serve/responses_api.h"

#include <fmt/format.h>

#include <set>
#include <utility>

#include "hyla/serve/api_request.h"
#include "hyla/serve/api_response.h"

namespace hyla {

using json = nlohmann::json;

namespace {

using api::field;
using api::invalid;

std::string string_at(const json& object, const char* key, const std::string& where) {
  const json* value = field(object, key);
  if (!value || !value->is_string()) invalid(where, fmt::format("{} needs a string '{}'", where, key));
  return value->get<std::string>();
}

// A message item's content as chat content: its text, or parts with images.
json message_content(const json& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array()) invalid(where, where + " must be a string or an array of content parts");
  json parts = json::array();
  bool images = false;
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    const std::string type = part.is_object() ? part.value("type", std::string()) : "";
    if (type == "input_text" || type == "output_text") {
      const std::string t = string_at(part, "text", at);
      parts.push_back({{"type", "text"}, {"text", t}});
      text += t;
    } else if (type == "input_image") {
      const json* url = field(part, "image_url");
      if (!url || !url->is_string())
        invalid(at, at + " (input_image) needs an 'image_url' data URL; this server reads no file ids or links");
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", *url}}}});
      images = true;
    } else {
      invalid(at, fmt::format("{} is a '{}' part; messages hold input_text, output_text and input_image parts", at, type));
    }
  }
  return images ? parts : json(text);
}

std::string output_text(const json& output, const std::string& where) {
  if (output.is_string()) return output.get<std::string>();
  const json content = message_content(output, where);
  if (!content.is_string()) invalid(where, where + ": a function call's output is text");
  return content.get<std::string>();
}

json tools_of(const json& tools) {
  if (!tools.is_array()) invalid("tools", "'tools' must be an array");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    const std::string type = t.is_object() ? t.value("type", std::string()) : "";
    if (type != "function")
      invalid(at, fmt::format("{} is a '{}' tool; this server runs none of OpenAI's hosted tools, only function tools",
                              at, type));
    json function = {{"name", string_at(t, "name", at)}, {"parameters", t.value("parameters", json::object())}};
    if (const json* description = field(t, "description")) function["description"] = *description;
    out.push_back({{"type", "function"}, {"function", function}});
  }
  return out;
}

json tool_choice_of(const json& choice) {
  if (choice.is_string()) return choice;  // none, auto, required: checked by the chat reader
  if (choice.is_object() && choice.value("type", json()) == "function" && choice.value("name", json()).is_string())
    return {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
  invalid("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}");
}

json response_format_of(const json& text) {
  const json* format = text.is_object() ? field(text, "format") : nullptr;
  if (!format) return nullptr;
  const std::string type = format->is_object() ? format->value("type", std::string()) : "";
  if (type == "text" || type == "json_object") return {{"type", type}};
  if (type == "json_schema")
    return {{"type", "json_schema"},
            {"json_schema", {{"name", format->value("name", json("response"))}, {"schema", format->value("schema", json())}}}};
  invalid("text.format", "'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                         "{\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}");
}

std::string effort_of(const json& reasoning) {
  const json effort = reasoning.is_object() ? reasoning.value("effort", json()) : json();
  if (!effort.is_string()) invalid("reasoning.effort", "'reasoning.effort' must be a string");
  return thinking_effort_of(effort.get<std::string>(), "reasoning.effort");
}

json reasoning_item(const std::string& id, const std::string& text) {
  return {{"type", "reasoning"},
          {"id", id},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

json message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "message"},
          {"id", id},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}};
}

json call_item(const std::string& id, const json& call, const char* status) {
  return {{"type", "function_call"},
          {"id", id},
          {"call_id", call["id"]},
          {"name", call["function"]["name"]},
          {"arguments", call["function"]["arguments"]},
          {"status", status}};
}

json usage_of(const json& usage) {
  const int64_t prompt = usage.value("prompt_tokens", int64_t(0)), completion = usage.value("completion_tokens", int64_t(0));
  const int64_t cached = usage.contains("prompt_tokens_details") ? usage["prompt_tokens_details"].value("cached_tokens", int64_t(0)) : 0;
  return {{"input_tokens", prompt},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", completion},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", prompt + completion}};
}

json response_object(const ResponseHeaderFields& header, const std::string& status, json output, json usage,
                     json incomplete) {
  json r = {{"id", header.id},
            {"object", "response"},
            {"created_at", header.created_at},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", std::move(incomplete)},
            {"output", std::move(output)},
            {"usage", std::move(usage)}};
  r.update(header.echo);
  return r;
}

}  // namespace

ResponsesRequest chat_body_from_responses(const json& body, const json& history) {
  if (!body.is_object()) invalid("", "the request body must be a JSON object");
  json chat = json::object();
  for (const char* key : {"model", "temperature", "top_p", "stream"})
    if (const json* value = field(body, key)) chat[key] = *value;
  if (const json* max = field(body, "max_output_tokens")) chat["max_tokens"] = *max;
  json conversation = history;
  std::set<std::string> calls;  // every call made so far, which outputs may answer
  for (const json& m : history)
    if (m.contains("tool_calls"))
      for (const json& call : m["tool_calls"]) calls.insert(call["id"].get<std::string>());
  const json* input = field(body, "input");
  if (!input || !(input->is_string() || (input->is_array() && !input->empty())))
    invalid("input", "'input' must be a string or a non-empty array of items");
  std::string reasoning;  // a reasoning item's text, for the assistant message that follows
  const auto assistant = [&]() -> json& {
    if (conversation.empty() || conversation.back()["role"] != "assistant" || !reasoning.empty()) {
      conversation.push_back({{"role", "assistant"}, {"content", ""}});
      if (!reasoning.empty()) conversation.back()["reasoning_content"] = std::exchange(reasoning, {});
    }
    return conversation.back();
  };
  if (input->is_string()) conversation.push_back({{"role", "user"}, {"content", *input}});
  else
    for (size_t i = 0; i < input->size(); ++i) {
      const json& item = (*input)[i];
      const std::string at = fmt::format("input[{}]", i);
      if (!item.is_object()) invalid(at, at + " must be an object");
      const std::string type = item.value("type", std::string(item.contains("role") ? "message" : ""));
      if (type == "message") {
        std::string role = string_at(item, "role", at);
        if (role == "developer") role = "system";
        if (role != "user" && role != "assistant" && role != "system")
          invalid(at + ".role", fmt::format("{}.role must be user, assistant, system or developer, got '{}'", at, role));
        if (!item.contains("content")) invalid(at + ".content", at + " has no 'content'");
        json content = message_content(item["content"], at + ".content");
        if (role == "assistant") {
          if (!content.is_string()) invalid(at + ".content", at + ": an assistant message holds text");
          json& m = assistant();
          m["content"] = m["content"].get<std::string>() + content.get<std::string>();
        } else {
          conversation.push_back({{"role", role}, {"content", std::move(content)}});
        }
      } else if (type == "reasoning") {
        for (const char* key : {"content", "summary"})
          if (const json* parts = field(item, key); parts && parts->is_array())
            for (const json& part : *parts)
              if (part.is_object() && part.value("text", json()).is_string()) reasoning += part["text"].get<std::string>();
      } else if (type == "function_call") {
        const std::string call_id = string_at(item, "call_id", at);
        json& m = assistant();
        if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
        m["tool_calls"].push_back({{"id", call_id},
                                   {"type", "function"},
                                   {"function", {{"name", string_at(item, "name", at)},
                                                 {"arguments", string_at(item, "arguments", at)}}}});
        calls.insert(call_id);
      } else if (type == "function_call_output") {
        const std::string call_id = string_at(item, "call_id", at);
        if (!calls.count(call_id))
          invalid(at + ".call_id", fmt::format("{}: no function call with call_id '{}' to answer", at, call_id));
        if (!item.contains("output")) invalid(at + ".output", at + " has no 'output'");
        conversation.push_back(
            {{"role", "tool"}, {"tool_call_id", call_id}, {"content", output_text(item["output"], at + ".output")}});
      } else {
        invalid(at, fmt::format("{} is a '{}' item; input items are message, reasoning, function_call and "
                                "function_call_output", at, type));
      }
    }
  json messages = json::array();
  if (const json* instructions = field(body, "instructions")) {
    if (!instructions->is_string()) invalid("instructions", "'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", *instructions}});
  }
  for (const json& m : conversation) messages.push_back(m);
  chat["messages"] = messages;
  if (const json* tools = field(body, "tools")) chat["tools"] = tools_of(*tools);
  if (const json* choice = field(body, "tool_choice")) chat["tool_choice"] = tool_choice_of(*choice);
  if (const json* text = field(body, "text"))
    if (json format = response_format_of(*text); !format.is_null()) chat["response_format"] = format;
  if (const json* reasoning_options = field(body, "reasoning"); reasoning_options && field(*reasoning_options, "effort"))
    chat["chat_template_kwargs"] = {{"thinking_effort", effort_of(*reasoning_options)}};
  return {std::move(chat), std::move(conversation)};
}

ResponseHeaderFields response_header(const json& body, const std::string& id, int64_t created_at, const std::string& model) {
  json echo = {{"model", model},
               {"instructions", body.value("instructions", json())},
               {"max_output_tokens", body.value("max_output_tokens", json())},
               {"previous_response_id", body.value("previous_response_id", json())},
               {"temperature", body.value("temperature", json(1.0))},
               {"top_p", body.value("top_p", json(1.0))},
               {"tools", body.value("tools", json::array())},
               {"tool_choice", body.value("tool_choice", json("auto"))},
               {"parallel_tool_calls", body.value("parallel_tool_calls", json(true))},
               {"reasoning", body.value("reasoning", json::object())},
               {"text", body.value("text", json{{"format", {{"type", "text"}}}})},
               {"store", body.value("store", json(true))},
               {"truncation", "disabled"},
               {"metadata", body.value("metadata", json::object())}};
  return {id, created_at, std::move(echo)};
}

json response_from_chat(const json& chat, const ResponseHeaderFields& header) {
  const json& choice = chat["choices"][0];
  const json& message = choice["message"];
  json output = json::array();
  if (message.value("reasoning_content", json()).is_string() && !message["reasoning_content"].get<std::string>().empty())
    output.push_back(reasoning_item(random_id("rs_"), message["reasoning_content"]));
  if (message.value("content", json()).is_string() && !message["content"].get<std::string>().empty())
    output.push_back(message_item(random_id("msg_"), message["content"], "completed"));
  if (message.contains("tool_calls"))
    for (const json& call : message["tool_calls"]) output.push_back(call_item(random_id("fc_"), call, "completed"));
  const bool cut = choice.value("finish_reason", std::string()) == "length";
  return response_object(header, cut ? "incomplete" : "completed", std::move(output), usage_of(chat["usage"]),
                         cut ? json{{"reason", "max_output_tokens"}} : json(nullptr));
}

ResponseEvents::ResponseEvents(ResponseHeaderFields header) : header_(std::move(header)) {}

std::string ResponseEvents::event(const std::string& type, json data) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return fmt::format("event: {}\ndata: {}\n\n", type, data.dump(-1, ' ', false, json::error_handler_t::replace));
}

json ResponseEvents::response(const std::string& status) const {
  return response_object(header_, status, output_, usage_.is_null() ? json(nullptr) : usage_, incomplete_);
}

std::string ResponseEvents::open_item(const std::string& type) {
  if (open_ == type) return {};
  std::string out = close_item();
  open_ = type;
  item_id_ = random_id(type == "reasoning" ? "rs_" : "msg_");
  text_.clear();
  const int64_t index = int64_t(output_.size());
  if (type == "reasoning") {
    json item = reasoning_item(item_id_, "");
    item["content"] = json::array();
    out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
    out += event("response.content_part.added", {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                                                  {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  } else {
    json item = message_item(item_id_, "", "in_progress");
    item["content"] = json::array();
    out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
    out += event("response.content_part.added",
                 {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                  {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  }
  return out;
}

std::string ResponseEvents::close_item() {
  if (open_.empty()) return {};
  const int64_t index = int64_t(output_.size());
  std::string out;
  json item;
  if (open_ == "function_call") {
    out += event("response.function_call_arguments.done", {{"item_id", item_id_}, {"output_index", index}, {"arguments", text_}});
    item = call_item(item_id_, tool_calls_.back(), "completed");
  } else if (open_ == "reasoning") {
    out += event("response.reasoning_text.done", {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    out += event("response.content_part.done", {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                                                 {"part", {{"type", "reasoning_text"}, {"text", text_}}}});
    item = reasoning_item(item_id_, text_);
  } else {
    out += event("response.output_text.done",
                 {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}, {"logprobs", json::array()}});
    out += event("response.content_part.done",
                 {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                  {"part", {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}}}});
    item = message_item(item_id_, text_, "completed");
  }
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  open_.clear();
  return out;
}

std::string ResponseEvents::push(const json& chunk) {
  if (chunk.contains("error")) {
    const json& e = chunk["error"];
    return event("error", {{"code", e.value("code", json())}, {"message", e.value("message", json("error"))}, {"param", e.value("param", json())}});
  }
  std::string out;
  if (!started_) {
    started_ = true;
    out += event("response.created", {{"response", response("in_progress")}});
    out += event("response.in_progress", {{"response", response("in_progress")}});
  }
  if (!chunk.contains("choices") || chunk["choices"].empty()) return out;
  const json& choice = chunk["choices"][0];
  const json& delta = choice.value("delta", json::object());
  if (const json* r = field(delta, "reasoning_content"); r && !r->get<std::string>().empty()) {
    out += open_item("reasoning");
    text_ += r->get<std::string>(), reasoning_ += r->get<std::string>();
    out += event("response.reasoning_text.delta",
                 {{"item_id", item_id_}, {"output_index", int64_t(output_.size())}, {"content_index", 0}, {"delta", *r}});
  }
  if (const json* c = field(delta, "content"); c && !c->get<std::string>().empty()) {
    out += open_item("message");
    text_ += c->get<std::string>(), content_ += c->get<std::string>();
    out += event("response.output_text.delta", {{"item_id", item_id_}, {"output_index", int64_t(output_.size())},
                                                {"content_index", 0}, {"delta", *c}, {"logprobs", json::array()}});
  }
  if (const json* calls = field(delta, "tool_calls")) {
    for (const json& call : *calls) {
      if (call.contains("id")) {  // the call opens: a function_call item
        out += close_item();
        open_ = "function_call";
        item_id_ = random_id("fc_");
        text_.clear();
        tool_calls_.push_back({{"id", call["id"]}, {"type", "function"}, {"function", {{"name", call["function"]["name"]}, {"arguments", ""}}}});
        out += event("response.output_item.added",
                     {{"output_index", int64_t(output_.size())}, {"item", call_item(item_id_, tool_calls_.back(), "in_progress")}});
      }
      const std::string arguments = call["function"].value("arguments", std::string());
      if (arguments.empty()) continue;
      text_ += arguments;
      tool_calls_.back()["function"]["arguments"] = text_;
      out += event("response.function_call_arguments.delta",
                   {{"item_id", item_id_}, {"output_index", int64_t(output_.size())}, {"delta", arguments}});
    }
  }
  if (field(choice, "finish_reason")) {
    out += close_item();
    if (chunk.contains("usage")) usage_ = usage_of(chunk["usage"]);
    const bool cut = choice["finish_reason"] == "length";
    if (cut) incomplete_ = {{"reason", "max_output_tokens"}};
    out += event(cut ? "response.incomplete" : "response.completed", {{"response", response(cut ? "incomplete" : "completed")}});
  }
  return out;
}

json ResponseEvents::assistant_message() const {
  json m = {{"role", "assistant"}, {"content", content_}};
  if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
  if (!tool_calls_.empty()) m["tool_calls"] = tool_calls_;
  return m;
}

void ResponseStore::evict(std::chrono::steady_clock::time_point now) {
  while (!entries_.empty() && (bytes_ > max_bytes_ || now - entries_.front().stored > ttl_)) {
    bytes_ -= entries_.front().bytes;
    index_.erase(entries_.front().id);
    entries_.pop_front();
  }
}

void ResponseStore::put(const std::string& id, json conversation) {
  // Generated text may hold invalid UTF-8 (a byte-level model's pieces): its size as sent, U+FFFD for those bytes.
  const size_t bytes = conversation.dump(-1, ' ', false, json::error_handler_t::replace).size();
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > max_bytes_) return;  // larger than the whole store: never kept
  entries_.push_back({id, std::move(conversation), bytes, std::chrono::steady_clock::now()});
  index_[id] = std::prev(entries_.end());
  bytes_ += bytes;
  evict(entries_.back().stored);
}

std::optional<json> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  evict(std::chrono::steady_clock::now());
  const auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return it->second->conversation;
}

}  // namespace hyla
