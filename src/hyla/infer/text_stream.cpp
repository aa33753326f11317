#include "hyla/infer/text_stream.h"

#include <algorithm>
#include <utility>

namespace hyla {
namespace {

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
size_t complete_utf8(std::string_view s) {
  size_t i = s.size(), back = 0;
  while (i > 0 && back < 4) {
    const auto c = uint8_t(s[i - 1]);
    if ((c & 0xc0) != 0x80) {  // a lead byte (or ASCII): is its sequence complete?
      const size_t need = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i, ++back;
  }
  return s.size();  // only continuation bytes: invalid UTF-8, passed through
}

}  // namespace

TextStream::TextStream(std::vector<std::string> stop) {
  for (std::string& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
}

std::string TextStream::push(std::string_view bytes) {
  if (stopped()) return {};
  bytes_.append(bytes);
  const size_t complete = complete_utf8(bytes_);
  held_.append(bytes_, 0, complete);
  bytes_.erase(0, complete);
  // A stop string inside the held text ends the output before it.
  size_t cut = std::string::npos;
  const std::string* found = nullptr;
  for (const std::string& s : stop_)
    if (const size_t at = held_.find(s); at < cut) cut = at, found = &s;
  if (found) {
    held_.resize(cut);
    stop_found_ = *found;
    text_ += held_;
    return std::exchange(held_, {});
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  std::string ready = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  text_ += ready;
  return ready;
}

std::string TextStream::flush() {
  if (stopped()) return {};
  std::string rest = held_ + bytes_;
  held_.clear(), bytes_.clear();
  text_ += rest;
  return rest;
}

}  // namespace hyla
