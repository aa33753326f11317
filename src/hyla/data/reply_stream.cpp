#include "hyla/data/reply_stream.h"

namespace hyla {

namespace {
// The part of `now` after the `sent` bytes already streamed (a partial reading only ever extends
// the one before; the final one may trim what was streamed, which is not taken back).
std::string unsent(const std::string& now, size_t& sent) {
  if (now.size() <= sent) return {};
  std::string out = now.substr(sent);
  sent = now.size();
  return out;
}
}  // namespace

ReplyStream::ReplyStream(const ChatTemplate& chat, const ChatOptions& options, std::string_view prefill)
    : chat_(&chat), options_(&options), text_(prefill) {
  const AssistantReply forced = chat_->parse_reply(text_, *options_, /*partial=*/true);
  sent_content_ = forced.content.size();
  sent_reasoning_ = forced.reasoning.size();
}

ReplyStream::Delta ReplyStream::push(std::string_view piece) {
  text_ += piece;
  const AssistantReply now = chat_->parse_reply(text_, *options_, /*partial=*/true);
  Delta delta{unsent(now.content, sent_content_), unsent(now.reasoning, sent_reasoning_), {}};
  for (size_t i = 0; i < now.tool_calls.size(); ++i) {
    const ToolCall& call = now.tool_calls[i];
    const bool opens = i == sent_arguments_.size();
    if (opens) sent_arguments_.emplace_back();
    std::string& sent = sent_arguments_[i];
    std::string more = call.arguments.starts_with(sent) ? call.arguments.substr(sent.size()) : std::string();
    if (!opens && more.empty()) continue;
    sent += more;
    delta.calls.push_back({i, opens ? call.name : std::string(), std::move(more)});
  }
  return delta;
}

ReplyStream::Finish ReplyStream::finish() {
  Finish out{chat_->parse_reply(text_, *options_), {}};
  AssistantReply& reply = out.reply;
  reply.content = unsent(reply.content, sent_content_);
  reply.reasoning = unsent(reply.reasoning, sent_reasoning_);
  for (size_t i = 0; i < reply.tool_calls.size(); ++i) {
    const ToolCall& call = reply.tool_calls[i];
    if (i >= sent_arguments_.size()) {
      out.calls.push_back({i, call.name, call.arguments});
    } else if (call.arguments.starts_with(sent_arguments_[i]) && call.arguments.size() > sent_arguments_[i].size()) {
      out.calls.push_back({i, std::string(), call.arguments.substr(sent_arguments_[i].size())});
    }
  }
  text_.clear();
  return out;
}

}  // namespace hyla
