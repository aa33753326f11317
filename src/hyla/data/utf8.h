#pragma once
// UTF-8 helpers for streaming text out token by token.
#include <cstddef>
#include <string_view>

namespace hyla {

// The length of the longest prefix of `bytes` that does not end inside an unfinished UTF-8
// character: a stream emits that much and keeps the rest until the next token completes it. Bytes
// that can never start or continue a character count as complete (they are passed through).
size_t utf8_complete_prefix(std::string_view bytes);

}  // namespace hyla
