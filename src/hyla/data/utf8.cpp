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

}  // namespace hyla
