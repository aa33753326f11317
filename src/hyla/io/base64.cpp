#include "hyla/io/base64.h"

#include <array>

#include "hyla/core/error.h"

namespace hyla {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> decoding_table() {
  std::array<int8_t, 256> t{};
  t.fill(-1);
  for (int i = 0; i < 64; ++i) t[uint8_t(kAlphabet[i])] = int8_t(i);
  return t;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int s : {18, 12, 6, 0}) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  if (i < bytes.size()) {
    const bool two = i + 1 < bytes.size();
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | (two ? uint32_t(uint8_t(bytes[i + 1])) << 8 : 0);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(two ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::vector<uint8_t> base64_decode(std::string_view text, std::string_view source) {
  static constexpr std::array<int8_t, 256> table = decoding_table();
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t v = 0;
  int have = 0, padding = 0;
  size_t symbols = 0;
  for (const char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    ++symbols;
    if (c == '=') {
      HYLA_CHECK(have >= 2 && padding < 2, "{}: misplaced '=' padding in base64", source);
      ++padding;
      continue;
    }
    const int8_t d = table[uint8_t(c)];
    HYLA_CHECK(d >= 0, "{}: '{}' is not a base64 character", source, c < 32 || c > 126 ? '?' : c);
    HYLA_CHECK(padding == 0, "{}: base64 data after '=' padding", source);
    v = v << 6 | uint32_t(d);
    if (++have == 4) {
      out.push_back(uint8_t(v >> 16));
      out.push_back(uint8_t(v >> 8));
      out.push_back(uint8_t(v));
      v = 0;
      have = 0;
    }
  }
  HYLA_CHECK(symbols % 4 == 0, "{}: base64 length {} is not a multiple of 4", source, symbols);
  if (have == 2 + (padding == 1 ? 1 : 0) && padding > 0) {
    v <<= 6 * (4 - have);
    out.push_back(uint8_t(v >> 16));
    if (have == 3) out.push_back(uint8_t(v >> 8));
  }
  return out;
}

}  // namespace hyla
