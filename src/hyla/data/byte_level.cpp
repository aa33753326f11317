#include "hyla/data/byte_level.h"

namespace hyla {

namespace {

struct ByteLevelTables {
  std::array<char32_t, 256> char_of{};
  std::array<int16_t, 324> byte_of{};  // code point -> byte, -1 if none; the map's code points are < 324
  std::array<uint8_t, 256> order{};
  ByteLevelTables() {
    byte_of.fill(-1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    int next_extra = 256, position = 0;
    for (int b = 0; b < 256; ++b)
      if (printable(b)) char_of[size_t(b)] = char32_t(b), order[size_t(position++)] = uint8_t(b);
    for (int b = 0; b < 256; ++b)
      if (!printable(b)) char_of[size_t(b)] = char32_t(next_extra++), order[size_t(position++)] = uint8_t(b);
    for (int b = 0; b < 256; ++b) byte_of[char_of[size_t(b)]] = int16_t(b);
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

}  // namespace

char32_t byte_level_char(uint8_t byte) { return tables().char_of[byte]; }

const std::array<uint8_t, 256>& byte_level_order() { return tables().order; }

std::string byte_level_encode(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) {
    const char32_t cp = byte_level_char(uint8_t(c));
    if (cp < 0x80) {
      out += char(cp);
    } else {  // every code point of the map is below U+0800: two UTF-8 bytes
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
  const auto& byte_of = tables().byte_of;
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c0 = uint8_t(text[i]);
    char32_t cp;
    if (c0 < 0x80) {
      cp = c0, i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() && (uint8_t(text[i + 1]) & 0xC0) == 0x80) {
      cp = char32_t((c0 & 0x1F) << 6 | (uint8_t(text[i + 1]) & 0x3F)), i += 2;
      if (cp < 0x80) return std::nullopt;  // overlong form
    } else {
      return std::nullopt;  // not UTF-8, or a character beyond U+07FF, which the map never uses
    }
    if (cp >= byte_of.size() || byte_of[cp] < 0) return std::nullopt;
    out += char(byte_of[cp]);
  }
  return out;
}

}  // namespace hyla
