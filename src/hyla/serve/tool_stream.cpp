#include "hyla/serve/tool_stream.h"

#include <algorithm>

namespace hyla {

namespace {
constexpr std::string_view kMarker = "<tool_call>";
}

ToolCallStream::ToolCallStream(std::string_view prefill) {
  if (!prefill.empty()) push(prefill);
}

std::string ToolCallStream::push(std::string_view piece) {
  held_ += piece;
  if (in_call_) return {};
  const size_t at = held_.find(kMarker);
  size_t emit;
  if (at != std::string::npos) {
    in_call_ = true;
    emit = at;
  } else {
    // Hold back the longest tail that could begin the marker.
    size_t keep = 0;
    for (size_t n = std::min(held_.size(), kMarker.size() - 1); n > 0; --n)
      if (std::string_view(held_).substr(held_.size() - n) == kMarker.substr(0, n)) {
        keep = n;
        break;
      }
    emit = held_.size() - keep;
  }
  std::string out = held_.substr(0, emit);
  held_.erase(0, emit);
  return out;
}

AssistantReply ToolCallStream::finish() {
  AssistantReply reply = parse_assistant_reply(held_);
  held_.clear();
  return reply;
}

}  // namespace hyla
