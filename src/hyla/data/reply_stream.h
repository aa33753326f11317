#pragma once
// Streaming an assistant reply through its chat format (data/chat_template.h): content and
// think-channel text stream as they become final (a tail that may begin a marker is held back;
// from a call's marker on, the reply is held), and the whole reply is read when it finishes.
#include <string>
#include <string_view>

#include "hyla/data/chat_template.h"

namespace hyla {

class ReplyStream {
 public:
  // `prefill`: text forced at the start of the reply (it is never streamed). `chat` and `options`
  // must outlive the stream.
  ReplyStream(const ChatTemplate& chat, const ChatOptions& options, std::string_view prefill = {});

  struct Delta {
    std::string content, reasoning;
  };
  Delta push(std::string_view piece);  // what may be streamed now
  // At the end: the tool calls, and the content and reasoning not streamed yet (all of a held
  // call's text when it does not parse).
  AssistantReply finish();

 private:
  const ChatTemplate* chat_;
  const ChatOptions* options_;
  std::string text_;
  size_t sent_content_ = 0, sent_reasoning_ = 0;
};

}  // namespace hyla
