#pragma once
// GPT-2's byte-to-unicode map: byte-level BPE vocabularies store each raw byte as one printable
// Unicode character (printable Latin-1 bytes as themselves, the other 68 bytes as U+0100..U+0143),
// so token strings in tokenizer.json are valid, visible UTF-8 even for arbitrary bytes.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hyla {

// The code point that stands for `byte`.
char32_t byte_level_char(uint8_t byte);
// The 256 bytes in GPT-2's order (printable bytes ascending, then the rest ascending); GPT-2-style
// vocabularies give the single-byte tokens ids in this order.
const std::array<uint8_t, 256>& byte_level_order();
// Raw bytes -> their byte-level string (UTF-8).
std::string byte_level_encode(std::string_view raw);
// A byte-level string -> raw bytes; nullopt if it is not UTF-8 or holds a character outside the map.
std::optional<std::string> byte_level_decode(std::string_view text);

}  // namespace hyla
