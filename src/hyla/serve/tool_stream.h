#pragma once
// Streaming an assistant reply that may end in tool calls: text streams as content until a
// "<tool_call>" marker appears (a possible partial marker is held back); from there the reply is
// held and parsed into tool calls when it finishes.
#include <string>
#include <string_view>

#include "hyla/data/chat_template.h"

namespace hyla {

class ToolCallStream {
 public:
  // `prefill`: text forced at the start of the reply (it is never streamed).
  explicit ToolCallStream(std::string_view prefill = {});
  std::string push(std::string_view piece);  // the content that may be streamed now
  // At the end: the tool calls, and content not streamed yet (all of the held text when it holds
  // no valid call).
  AssistantReply finish();

 private:
  std::string held_;
  bool in_call_ = false;
};

}  // namespace hyla
