#include "hyla/serve/api_request.h"

#include <fmt/format.h>

#include <charconv>
#include <random>

#include "hyla/data/chat_template.h"
#include "hyla/data/image_file.h"
#include "hyla/io/base64.h"
#include "hyla/infer/json_grammar.h"
#include "hyla/io/json_fields.h"
#include "hyla/serve/api_error.h"

namespace hyla {

using json = nlohmann::json;

namespace {

std::string type_name(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "boolean";
  if (j.is_number()) return "number";
  if (j.is_string()) return "string";
  if (j.is_array()) return "array";
  return "object";
}

using api::field;
using api::invalid;

double number(const json& body, const char* name, double fallback, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number()) invalid(name, fmt::format("'{}' must be a number, got {}", name, type_name(*v)));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) invalid(name, fmt::format("'{}' must lie in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

int64_t integer(const json& body, const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_number_integer()) invalid(name, fmt::format("'{}' must be an integer, got {}", name, type_name(*v)));
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
  if (x < lo || x > hi) invalid(name, fmt::format("'{}' must lie in [{}, {}], got {}", name, lo, hi, x));
  return x;
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) invalid(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(*v)));
  return v->get<bool>();
}

std::string string(const json& j, const std::string& param) {
  if (!j.is_string()) invalid(param, fmt::format("'{}' must be a string, got {}", param, type_name(j)));
  return j.get<std::string>();
}

void check_model(const json& body, const std::string& served_model) {
  const json* model = field(body, "model");
  if (!model) return;
  const std::string name = string(*model, "model");
  if (name != served_model)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", name, served_model),
                   "model", "model_not_found");
}

// Options the engine does not implement are refused when set to anything but their neutral value,
// rather than silently ignored.
void refuse_unsupported(const json& body) {
  if (integer(body, "best_of", 1, 1, 1) != 1) invalid("best_of", "'best_of' must be 1");
  if (const json* suffix = field(body, "suffix"); suffix && !(suffix->is_string() && suffix->get<std::string>().empty()))
    invalid("suffix", "'suffix' is not supported by hyla serve");
}

// response_format: text (no constraint), json_object or json_schema (grammar-constrained sampling).
std::shared_ptr<const Grammar> response_format(const json& body) {
  const json* format = field(body, "response_format");
  if (!format) return nullptr;
  const json* type_field = format->is_object() ? field(*format, "type") : nullptr;
  const std::string type = type_field && type_field->is_string() ? type_field->get<std::string>() : "";
  if (type == "text") return nullptr;
  if (type == "json_object") return json_object_grammar();
  if (type != "json_schema")
    invalid("response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                               "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}");
  const json* spec = field(*format, "json_schema");
  if (!spec || !spec->is_object() || !field(*spec, "schema"))
    invalid("response_format", "response_format of type json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}");
  try {
    return json_schema_grammar((*spec)["schema"], "response_format.json_schema.schema");
  } catch (const Error& e) {
    invalid("response_format", e.what());
  }
}

// {"token id": bias, ...}: ids as decimal strings, as OpenAI's API takes them.
std::vector<std::pair<int32_t, float>> logit_bias(const json& body, const Tokenizer& tokenizer) {
  std::vector<std::pair<int32_t, float>> biases;
  const json* bias = field(body, "logit_bias");
  if (!bias) return biases;
  if (!bias->is_object()) invalid("logit_bias", fmt::format("'logit_bias' must be an object of token id → bias, got {}", type_name(*bias)));
  for (const auto& [key, value] : bias->items()) {
    int64_t id = -1;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc() || end != key.data() + key.size() || id < 0 || id >= tokenizer.vocab_size())
      invalid("logit_bias", fmt::format("logit_bias keys must be token ids in [0, {}), got '{}'", tokenizer.vocab_size(), key));
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
      invalid("logit_bias", fmt::format("logit_bias['{}'] must be a number in [-100, 100], got {}", key, json_excerpt(value)));
    biases.emplace_back(int32_t(id), value.get<float>());
  }
  return biases;
}

void read_common(const json& body, const Tokenizer& tokenizer, const ServeLimits& limits, ApiRequest& r) {
  refuse_unsupported(body);
  SamplingParams& s = r.generation.sampling;
  s.temperature = number(body, "temperature", 1.0, 0, 2);
  s.top_p = number(body, "top_p", 1.0, 0, 1);
  if (s.top_p == 0) s.top_p = 1e-9;  // OpenAI accepts 0: keep only the most likely token
  s.top_k = integer(body, "top_k", 0, 0, INT32_MAX);
  s.min_p = number(body, "min_p", 0, 0, 1);
  s.frequency_penalty = number(body, "frequency_penalty", 0, -2, 2);
  s.presence_penalty = number(body, "presence_penalty", 0, -2, 2);
  s.logit_bias = logit_bias(body, tokenizer);
  r.generation.grammar = response_format(body);
  s.seed = field(body, "seed") ? uint64_t(integer(body, "seed", 0, INT64_MIN, INT64_MAX)) : std::random_device()();
  r.n = integer(body, "n", 1, 1, limits.max_choices);
  r.stream = boolean(body, "stream", false);
  r.generation.stop_at_end_tokens = !boolean(body, "ignore_eos", false);  // vLLM's extension
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) invalid("stream_options", "'stream_options' must be an object");
    r.include_usage = boolean(*options, "include_usage", false);
  }
  if (const json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.generation.stop = {stop->get<std::string>()};
    } else if (stop->is_array() && stop->size() <= 4) {
      for (const json& s : *stop) r.generation.stop.push_back(string(s, "stop"));
    } else {
      invalid("stop", "'stop' must be a string or an array of at most 4 strings");
    }
    for (const std::string& s : r.generation.stop)
      if (s.empty()) invalid("stop", "stop strings must not be empty");
  }
}

// max_tokens against the per-request cap and the context.
void check_lengths(ApiRequest& r, const ServeLimits& limits, const char* param) {
  if (r.generation.max_tokens > limits.max_tokens)
    invalid(param, fmt::format("'{}' is {}, above this server's limit of {}", param, r.generation.max_tokens, limits.max_tokens));
  if (int64_t(r.prompts.size()) * r.n > limits.max_choices)
    invalid("n", fmt::format("{} prompts × n = {} choices exceed this server's limit of {}", r.prompts.size(),
                             int64_t(r.prompts.size()) * r.n, limits.max_choices));
  for (const auto& prompt : r.prompts) {
    const int64_t total = int64_t(prompt.size()) + std::max<int64_t>(r.generation.max_tokens, 1);
    if (total > limits.context)
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                 "({} in the prompt, {} for the completion). Please reduce the length of the prompt or "
                                 "the completion.",
                                 limits.context, total, prompt.size(), r.generation.max_tokens),
                     "messages", "context_length_exceeded");
  }
}

void refuse_streamed_logprobs(const ApiRequest& r) {
  if (r.stream && r.logprobs >= 0)
    invalid("logprobs", "'logprobs' are only returned by complete responses here; send the request with stream: false");
}

std::vector<int32_t> token_ids(const json& array, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (const json& id : array) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tokenizer.vocab_size())
      invalid("prompt", fmt::format("prompt token ids must be integers in [0, {}), got {}", tokenizer.vocab_size(), json_excerpt(id)));
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

}  // namespace

ApiRequest parse_completion_request(const json& body, const Tokenizer& tokenizer, const std::string& served_model,
                                    const ServeLimits& limits) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model(body, served_model);
  ApiRequest r;
  read_common(body, tokenizer, limits, r);
  const json* prompt = field(body, "prompt");
  if (!prompt) invalid("prompt", "'prompt' is required");
  // A string, an array of strings, an array of token ids, or an array of such arrays.
  if (prompt->is_string()) {
    r.prompts.push_back(tokenizer.encode(prompt->get<std::string>()));
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    r.prompts.push_back(token_ids(*prompt, tokenizer));
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const json& p : *prompt) {
      if (p.is_string()) r.prompts.push_back(tokenizer.encode(p.get<std::string>()));
      else if (p.is_array()) r.prompts.push_back(token_ids(p, tokenizer));
      else invalid("prompt", "'prompt' must be a string, an array of strings, or token ids");
    }
  } else {
    invalid("prompt", "'prompt' must be a non-empty string, array of strings, or array of token ids");
  }
  for (const auto& p : r.prompts)
    if (p.empty()) invalid("prompt", "a prompt encodes to no tokens");
  r.generation.max_tokens = integer(body, "max_tokens", 16, 0, INT64_MAX);
  r.echo = boolean(body, "echo", false);
  r.logprobs = int(integer(body, "logprobs", -1, 0, 5));
  if (r.generation.max_tokens == 0 && !r.echo) invalid("max_tokens", "'max_tokens' 0 needs 'echo' (scoring the prompt)");
  if (r.stream && r.generation.max_tokens == 0) invalid("stream", "'stream' needs 'max_tokens' > 0");
  check_lengths(r, limits, "max_tokens");
  r.generation.logprobs = r.logprobs >= 0;
  r.generation.prompt_logprobs = r.echo && r.logprobs >= 0;
  r.generation.top_logprobs = std::max(r.logprobs, 0);
  refuse_streamed_logprobs(r);
  return r;
}

// An OpenAI image part, {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}, as
// the model image it becomes; remote URLs are refused (the server fetches nothing).
static Image image_part(const json& part, const std::string& where, const ServeLimits& limits) {
  if (!limits.vision.enabled)
    invalid(where, where + ": this model does not read images: it has no vision tower (a text GGUF takes one from "
                           "an mmproj file: serve --mmproj FILE)");
  const json* image_url = field(part, "image_url");
  const json* url = image_url && image_url->is_object() ? field(*image_url, "url") : image_url;
  if (!url || !url->is_string())
    invalid(where, where + ": an image_url part needs {\"image_url\": {\"url\": \"data:image/png;base64,...\"}}");
  const std::string& text = url->get_ref<const std::string&>();
  const size_t comma = text.find(',');
  const std::string_view header = std::string_view(text).substr(0, comma == std::string::npos ? 0 : comma);
  if (!text.starts_with("data:"))
    invalid(where, where + ": only data URLs are accepted (data:image/png;base64,... or data:image/jpeg;base64,...); "
                           "the server fetches no remote URL");
  if (header != "data:image/png;base64" && header != "data:image/jpeg;base64" && header != "data:image/jpg;base64")
    invalid(where, fmt::format("{}: the data URL must be data:image/png;base64,... or data:image/jpeg;base64,..., got '{}'",
                               where, header.substr(0, 40)));
  try {
    const std::string_view payload = std::string_view(text).substr(comma + 1);
    if (int64_t(payload.size()) / 4 * 3 > limits.max_image_bytes + 3)
      invalid(where, fmt::format("{}: the image is larger than the server's limit of {} bytes", where, limits.max_image_bytes));
    const std::vector<uint8_t> bytes = base64_decode(payload, where);
    const Image decoded = decode_image(bytes, where, {limits.max_image_bytes, limits.max_image_pixels});
    return to_model_image(decoded, limits.vision, where);
  } catch (const Error& e) {
    invalid(where, e.what());
  }
}

// chat_template_kwargs (vLLM's field): the Kimi K3 template's switches.
// OpenAI's reasoning_effort in Kimi K3's words (low, high, max): minimal is low, medium is high.
std::string thinking_effort_of(const std::string& effort, const std::string& param) {
  if (effort == "minimal" || effort == "low") return "low";
  if (effort == "medium" || effort == "high") return "high";
  if (effort == "max") return "max";
  invalid(param, fmt::format("'{}' must be minimal, low, medium, high or max, got '{}'", param, effort));
}

static void read_template_kwargs(const json& body, ChatOptions& options) {
  if (const json* effort = field(body, "reasoning_effort")) {
    if (!effort->is_string()) invalid("reasoning_effort", "'reasoning_effort' must be a string");
    options.thinking_effort = thinking_effort_of(effort->get<std::string>(), "reasoning_effort");
  }
  const json* kwargs = field(body, "chat_template_kwargs");
  if (!kwargs) return;
  if (!kwargs->is_object()) invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  for (const auto& [key, value] : kwargs->items()) {
    if (key == "thinking" && value.is_boolean()) options.thinking = value.get<bool>();
    else if (key == "thinking_effort" && (value.is_null() || value == "low" || value == "high" || value == "max"))
      options.thinking_effort = value.is_null() ? "" : value.get<std::string>();
    else
      invalid("chat_template_kwargs", fmt::format("chat_template_kwargs.{} is not a template switch: they are "
                                                  "'thinking' (a boolean) and 'thinking_effort' (low, high, max or null)", key));
  }
}

ApiRequest parse_chat_request(const json& body, const Tokenizer& tokenizer, const std::string& served_model,
                              const ServeLimits& limits) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model(body, served_model);
  ApiRequest r;
  r.chat = true;
  read_common(body, tokenizer, limits, r);

  const json* messages = field(body, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    invalid("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> chat;
  int64_t images_seen = 0;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) invalid(where, where + " must be an object");
    if (!m.contains("role")) invalid(where + ".role", where + " has no 'role'");
    ChatMessage message;
    message.role = string(m["role"], where + ".role");
    if (message.role == "developer") message.role = "system";
    if (message.role != "system" && message.role != "user" && message.role != "assistant" && message.role != "tool")
      invalid(where + ".role", fmt::format("{}.role must be system, developer, user, assistant or tool, got '{}'", where, message.role));
    if (const json* content = field(m, "content")) {
      if (content->is_string()) {
        message.content = content->get<std::string>();
      } else if (content->is_array()) {
        for (size_t k = 0; k < content->size(); ++k) {
          const json& part = (*content)[k];
          const std::string part_where = fmt::format("{}.content[{}]", where, k);
          if (part.is_object() && part.value("type", json()) == "image_url") {
            if (message.role != "user") invalid(part_where, part_where + ": images are read in user messages only");
            if (images_seen++ == limits.max_images)
              invalid(part_where, fmt::format("{}: more than {} images in one request (the server's limit)", part_where,
                                              limits.max_images));
            message.images.push_back({message.content.size(), image_part(part, part_where, limits)});
            continue;
          }
          if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
            invalid(part_where, part_where + ": parts are {\"type\": \"text\", \"text\": ...} or {\"type\": "
                                             "\"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,...\"}}");
          message.content += part["text"].get<std::string>();
        }
      } else {
        invalid(where + ".content", fmt::format("{}.content must be a string or an array of parts, got {}", where, type_name(*content)));
      }
    } else if (message.role != "assistant") {
      invalid(where + ".content", where + " has no 'content'");
    }
    if (const json* name = field(m, "name")) message.name = string(*name, where + ".name");
    if (const json* id = field(m, "tool_call_id")) {
      if (message.role != "tool") invalid(where + ".tool_call_id", "'tool_call_id' belongs on a tool message");
      message.tool_call_id = string(*id, where + ".tool_call_id");
    }
    if (const json* reasoning = field(m, "reasoning_content")) {
      if (message.role != "assistant" || !reasoning->is_string())
        invalid(where + ".reasoning_content", "'reasoning_content' must be a string on an assistant message");
      message.reasoning = reasoning->get<std::string>();
    }
    if (const json* calls = field(m, "tool_calls")) {
      if (message.role != "assistant" || !calls->is_array())
        invalid(where + ".tool_calls", "'tool_calls' must be an array on an assistant message");
      for (const json& call : *calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          invalid(where + ".tool_calls", "each tool call needs a 'function' object");
        const json& f = call["function"];
        ToolCall tc;
        tc.name = string(f.value("name", json()), where + ".tool_calls.function.name");
        const json args = f.value("arguments", json("{}"));
        tc.arguments = args.is_string() ? args.get<std::string>() : args.dump();
        if (const json* id = field(call, "id")) tc.id = string(*id, where + ".tool_calls.id");
        message.tool_calls.push_back(std::move(tc));
      }
    }
    chat.push_back(std::move(message));
  }

  std::vector<std::string> functions, names;
  std::vector<ToolSchema> schemas;
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) invalid("tools", "'tools' must be an array");
    for (const json& tool : *tools) {
      if (!tool.is_object() || tool.value("type", json()) != "function" || !tool.contains("function") ||
          !tool["function"].is_object() || !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        invalid("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}");
      functions.push_back(tool["function"].dump());
      names.push_back(tool["function"]["name"].get<std::string>());
      schemas.push_back({names.back(), tool["function"].value("parameters", json())});
      const json& description = tool["function"].value("description", json(""));
      r.tools.push_back({names.back(), description.is_string() ? description.get<std::string>() : "",
                         tool["function"].value("parameters", json::object())});
    }
  }
  const ChatTemplate chat_template(tokenizer);
  ChatOptions& options = r.chat_options;
  options.tools = functions;
  read_template_kwargs(body, options);
  std::vector<ToolSchema> forced;  // the tools a forced call may name
  std::string choice = functions.empty() ? "none" : "auto";
  size_t previous_calls = 0;
  for (const ChatMessage& m : chat) previous_calls += m.tool_calls.size();
  try {
    if (const json* tc = field(body, "tool_choice")) {
      if (tc->is_string()) {
        choice = tc->get<std::string>();
        if (choice != "none" && choice != "auto" && choice != "required")
          invalid("tool_choice", "'tool_choice' must be none, auto, required or a named function");
      } else if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object() &&
                 (*tc)["function"].value("name", json()).is_string()) {
        const std::string name = (*tc)["function"]["name"].get<std::string>();
        if (std::find(names.begin(), names.end(), name) == names.end())
          invalid("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", name));
        r.prefill = chat_template.forced_call_prefix(name, previous_calls);
        forced.push_back(schemas[size_t(std::find(names.begin(), names.end(), name) - names.begin())]);
      } else {
        invalid("tool_choice", "'tool_choice' must be none, auto, required or a named function");
      }
      if (choice != "none" && functions.empty()) invalid("tool_choice", "'tool_choice' needs 'tools'");
    }
    if (choice == "required") {
      r.prefill = chat_template.forced_call_prefix("", previous_calls);
      forced = schemas;
    }
  } catch (const Error& e) {
    invalid("tool_choice", e.what());
  }
  options.tool_choice = choice;
  if (!forced.empty() && r.generation.grammar)
    invalid("response_format", "'response_format' cannot constrain a reply that 'tool_choice' forces to be a tool call");
  if (r.generation.grammar && chat_template.format() == ChatFormat::KimiK3)
    invalid("response_format", "'response_format' cannot constrain a Kimi K3 reply: it is written in its template's "
                               "think and response channels");
  if (chat_template.format() == ChatFormat::KimiK3 && !forced.empty()) {
    // Kimi K3's forced call: free thinking, then the tools section the grammar holds to the schemas.
    const std::optional<int32_t> open = tokenizer.token_id("<|open|>"), sep = tokenizer.token_id("<|sep|>"),
                                 close = tokenizer.token_id("<|close|>");
    if (!open || !sep || !close) invalid("tool_choice", "this tokenizer lacks Kimi K3's tag tokens, so a call cannot be forced");
    try {
      r.generation.grammar = kimi_k3_call_grammar(forced, options.thinking, /*one_call=*/choice != "required",
                                                  {*open, *sep, *close});
    } catch (const Error& e) {
      invalid("tools", e.what());
    }
  }
  if (chat_template.format() == ChatFormat::KimiK2 && !schemas.empty() && choice != "none") {
    // Kimi K2's calls are held to the tools' schemas as hyla's are: a forced one from its prefix on,
    // an "auto" one from its begin marker (Kimi K3's calls are tags around the think channel's end,
    // read as written).
    const std::optional<int32_t> begin = tokenizer.token_id("<|tool_call_begin|>"),
                                 argument = tokenizer.token_id("<|tool_call_argument_begin|>"),
                                 end = tokenizer.token_id("<|tool_call_end|>");
    if (begin && argument && end && (!forced.empty() || !r.generation.grammar)) {
      try {
        r.generation.grammar = kimi_k2_call_grammar(forced.empty() ? schemas : forced,
                                                    /*named=*/!forced.empty() && choice != "required", previous_calls,
                                                    {*argument, *end});
      } catch (const Error& e) {
        invalid("tools", e.what());
      }
      if (forced.empty()) r.generation.grammar_after = *begin;
    }
  }
  if (chat_template.format() == ChatFormat::Hyla) {
    // hyla's calls end at the </tool_call> token, so a grammar can hold them to the tools' schemas.
    const std::optional<int32_t> open = tokenizer.token_id("<tool_call>"), close = tokenizer.token_id("</tool_call>");
    if (!forced.empty()) {
      // The forced call is well-formed by construction: its JSON follows the tool's parameters schema.
      if (!close) invalid("tool_choice", "this model's tokenizer has no </tool_call> token, so a call cannot be forced");
      try {
        r.generation.grammar =
            tool_call_grammar(forced, choice == "required" ? ToolCallFrom::Object : ToolCallFrom::Arguments, *close);
      } catch (const Error& e) {
        invalid("tools", e.what());
      }
    } else if (choice == "auto" && !r.generation.grammar && open && close) {
      // The model may answer in text; a call it starts is held to the tools' schemas from its marker on.
      try {
        r.generation.grammar = tool_call_grammar(schemas, ToolCallFrom::Marker, *close);
      } catch (const Error& e) {
        invalid("tools", e.what());
      }
      r.generation.grammar_after = *open;
    }
  }

  std::vector<int32_t> prompt;
  try {
    prompt = chat_template.encode(chat, /*add_generation_prompt=*/true, options, limits.vision.position_pixels());
  } catch (const Error& e) {
    invalid("messages", e.what());
  }
  r.generation.images = chat_images(chat);
  if (!r.prefill.empty()) tokenizer.encode_append(r.prefill, /*allow_special=*/true, prompt);
  r.prompts.push_back(std::move(prompt));

  const int64_t room = std::max<int64_t>(limits.context - int64_t(r.prompts[0].size()), 1);
  const char* max_name = field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.generation.max_tokens = integer(body, max_name, std::min(limits.max_tokens, room), 1, INT64_MAX);
  r.generation.logprobs = boolean(body, "logprobs", false);
  r.logprobs = r.generation.logprobs ? int(integer(body, "top_logprobs", 0, 0, 20)) : -1;
  if (!r.generation.logprobs && field(body, "top_logprobs") && integer(body, "top_logprobs", 0, 0, 20) > 0)
    invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r.generation.top_logprobs = std::max(r.logprobs, 0);
  refuse_streamed_logprobs(r);
  check_lengths(r, limits, max_name);
  r.guardrails = limits.guardrails;
  r.generation.logprobs = r.generation.logprobs || r.guardrails.judges_confidence();
  r.stopped = conversation_guardrail(chat, r.guardrails);
  return r;
}

}  // namespace hyla
