#pragma once
// Streaming an assistant reply through its chat format (data/chat_template.h): content and
// think-channel text stream as they become final (a tail that may begin a marker is held back),
// each tool call opens once its name is written and its arguments stream as they are written, and
// the whole reply is read when it finishes.
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/chat_template.h"

namespace hyla {

class ReplyStream {
 public:
  // `prefill`: text forced at the start of the reply (it is never streamed). `chat` and `options`
  // must outlive the stream.
  ReplyStream(const ChatTemplate& chat, const ChatOptions& options, std::string_view prefill = {});

  // What of a tool call may be streamed: its tool's name when the call opens (empty after), and
  // the text of its arguments not sent yet.
  struct CallDelta {
    size_t index = 0;
    std::string name, arguments;
  };
  struct Delta {
    std::string content, reasoning;
    std::vector<CallDelta> calls;
  };
  Delta push(std::string_view piece);  // what may be streamed now
  // At the end: the content and reasoning not streamed yet (all of a held call's text when it
  // does not parse) and the whole reply's calls, and what of those calls was not streamed. A call
  // whose final arguments do not begin with what was streamed gets nothing more (its streamed text
  // stands; the final reply says what was meant).
  struct Finish {
    AssistantReply reply;
    std::vector<CallDelta> calls;
  };
  Finish finish();

 private:
  const ChatTemplate* chat_;
  const ChatOptions* options_;
  std::string text_;
  size_t sent_content_ = 0, sent_reasoning_ = 0;
  std::vector<std::string> sent_arguments_;  // per call opened
};

}  // namespace hyla
