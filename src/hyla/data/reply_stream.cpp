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
  return {unsent(now.content, sent_content_), unsent(now.reasoning, sent_reasoning_)};
}

AssistantReply ReplyStream::finish() {
  AssistantReply reply = chat_->parse_reply(text_, *options_);
  reply.content = unsent(reply.content, sent_content_);
  reply.reasoning = unsent(reply.reasoning, sent_reasoning_);
  text_.clear();
  return reply;
}

}  // namespace hyla
