#include "hyla/data/utf8.h"

#include <cstdint>

namespace hyla {

size_t utf8_complete_prefix(std::string_view bytes) {
  // Only the last three bytes can belong to an unfinished character (at most four bytes long).
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = uint8_t(bytes[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back for the lead
    const size_t needed = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    return needed > back ? n - back : n;
  }
  return n;
}

std::string visible_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto b = uint8_t(c);
    if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f) {
      // U+2400 + b for C0, U+2421 for DEL: E2 90 80+b / E2 90 A1.
      out += "\xe2\x90";
      out += char(b == 0x7f ? 0xa1 : 0x80 + b);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace hyla
