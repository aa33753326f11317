#include "hyla/serve/api_response.h"

#include <cmath>
#include <random>

#include "hyla/core/error.h"

namespace hyla {

using json = nlohmann::json;

std::string random_id(const std::string& prefix) {
  static const char alphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % (sizeof(alphabet) - 1)];
  return id;
}

json ResponseHeader::to_json() const { return {{"id", id}, {"object", object}, {"created", created}, {"model", model}}; }

void Usage::add(const GenerationOutput& out) {
  prompt_tokens += out.prompt_tokens;
  completion_tokens += int64_t(out.tokens.size());
  cached_tokens += out.cached_prompt_tokens;
}

json Usage::to_json() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string finish_reason(const GenerationOutput& out, bool has_tool_calls) {
  // A cancelled request never reaches a client as a finish reason (the server answers 503 instead).
  HYLA_ASSERT(out.finish_reason != FinishReason::Cancelled);
  if (has_tool_calls && out.finish_reason == FinishReason::Stop) return "tool_calls";
  return to_string(out.finish_reason);
}

json stop_reason(const GenerationOutput& out) {
  return out.stop_sequence.empty() ? json(nullptr) : json(out.stop_sequence);
}

namespace {

json logprob_value(double lp) { return std::isnan(lp) ? json(nullptr) : json(lp); }

// {token text: logprob} for the alternatives at one position (null where there are none).
json top_map(const std::vector<std::vector<TokenLogprob>>& tops, size_t i, const Tokenizer& tokenizer) {
  if (i >= tops.size() || tops[i].empty()) return nullptr;
  json map = json::object();
  for (const TokenLogprob& t : tops[i]) map[std::string(tokenizer.decode_token(t.token))] = t.logprob;
  return map;
}

json completion_logprobs(const ApiRequest& request, const FinishedChoice& choice, const Tokenizer& tokenizer) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  int64_t offset = 0;
  auto add = [&](int32_t id, double lp, json top) {
    const std::string_view text = tokenizer.decode_token(id);
    tokens.push_back(std::string(text));
    values.push_back(logprob_value(lp));
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += int64_t(text.size());
  };
  const GenerationOutput& out = choice.output;
  if (request.echo)
    for (size_t i = 0; i < choice.prompt->size(); ++i)
      add((*choice.prompt)[i], i < out.prompt_logprobs.size() ? out.prompt_logprobs[i] : NAN,
          request.logprobs > 0 ? top_map(out.prompt_top_logprobs, i, tokenizer) : json(nullptr));
  for (size_t i = 0; i < out.tokens.size(); ++i)
    add(out.tokens[i], i < out.token_logprobs.size() ? out.token_logprobs[i] : NAN,
        request.logprobs > 0 ? top_map(out.top_logprobs, i, tokenizer) : json(nullptr));
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json token_entry(int32_t id, double lp, const Tokenizer& tokenizer) {
  const std::string_view text = tokenizer.decode_token(id);
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return {{"token", std::string(text)}, {"logprob", lp}, {"bytes", bytes}};
}

json chat_logprobs(const FinishedChoice& choice, const Tokenizer& tokenizer) {
  json content = json::array();
  const GenerationOutput& out = choice.output;
  for (size_t i = 0; i < out.tokens.size() && i < out.token_logprobs.size(); ++i) {
    json entry = token_entry(out.tokens[i], out.token_logprobs[i], tokenizer);
    json top = json::array();
    if (i < out.top_logprobs.size())
      for (const TokenLogprob& t : out.top_logprobs[i]) top.push_back(token_entry(t.token, t.logprob, tokenizer));
    entry["top_logprobs"] = top;
    content.push_back(std::move(entry));
  }
  return {{"content", content}};
}

}  // namespace

json completion_response(const ResponseHeader& header, const ApiRequest& request,
                         const std::vector<FinishedChoice>& choices, const Tokenizer& tokenizer) {
  json response = header.to_json();
  Usage usage;
  json list = json::array();
  for (const FinishedChoice& c : choices) {
    usage.add(c.output);
    list.push_back({{"index", c.index},
                    {"text", (request.echo ? tokenizer.decode(*c.prompt) : std::string()) + c.output.text},
                    {"logprobs", request.logprobs >= 0 ? completion_logprobs(request, c, tokenizer) : json(nullptr)},
                    {"finish_reason", finish_reason(c.output, false)},
                    {"stop_reason", stop_reason(c.output)}});
  }
  response["choices"] = list;
  response["usage"] = usage.to_json();
  return response;
}

json completion_chunk(const ResponseHeader& header, int64_t index, const std::string& text, const json& finish) {
  json chunk = header.to_json();
  chunk["choices"] = json::array({{{"index", index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}}});
  return chunk;
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json list = json::array();
  for (const ToolCall& call : calls)
    list.push_back({{"id", random_id("call_")},
                    {"type", "function"},
                    {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  return list;
}

ChatReply chat_reply(const ApiRequest& request, const GenerationOutput& out, AssistantReply parsed) {
  std::optional<GuardrailStop> stop = request.stopped;
  if (!stop)
    stop = reply_guardrail(parsed, out.token_logprobs, request.chat_options.offers_tools() ? &request.tools : nullptr,
                           request.guardrails);
  if (!stop) return {std::move(parsed), std::nullopt};
  return {AssistantReply{request.guardrails.fallback, {}}, std::move(stop)};
}

json chat_response(const ResponseHeader& header, const ApiRequest& request, const std::vector<FinishedChoice>& choices,
                   const Tokenizer& tokenizer) {
  json response = header.to_json();
  Usage usage;
  json list = json::array();
  const ChatTemplate chat_template(tokenizer);
  for (const FinishedChoice& c : choices) {
    usage.add(c.output);
    const auto [reply, guardrail] =
        chat_reply(request, c.output, chat_template.parse_reply(request.prefill + c.output.text, request.chat_options));
    json message = {{"role", "assistant"},
                    {"content", reply.content.empty() && !reply.tool_calls.empty() ? json(nullptr) : json(reply.content)}};
    if (!reply.reasoning.empty()) message["reasoning_content"] = reply.reasoning;
    if (!reply.tool_calls.empty()) message["tool_calls"] = tool_calls_json(reply.tool_calls);
    json choice = {{"index", c.index},
                   {"message", message},
                   {"logprobs", request.logprobs >= 0 ? chat_logprobs(c, tokenizer) : json(nullptr)},
                   {"finish_reason", guardrail ? "stop" : finish_reason(c.output, !reply.tool_calls.empty())},
                   {"stop_reason", stop_reason(c.output)}};
    if (guardrail) choice["guardrail"] = guardrail->to_json();
    list.push_back(std::move(choice));
  }
  response["choices"] = list;
  response["usage"] = usage.to_json();
  return response;
}

json chat_chunk(const ResponseHeader& header, int64_t index, const json& delta, const json& finish) {
  json chunk = header.to_json();
  chunk["choices"] = json::array({{{"index", index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}});
  return chunk;
}

}  // namespace hyla
