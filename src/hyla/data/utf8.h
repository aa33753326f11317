#pragma once
// UTF-8 helpers for streaming text out token by token.
#include <cstddef>
#include <string>
#include <string_view>

namespace hyla {

// The length of the longest prefix of `bytes` that does not end inside an unfinished UTF-8
// character: a stream emits that much and keeps the rest until the next token completes it. Bytes
// that can never start or continue a character count as complete (they are passed through).
size_t utf8_complete_prefix(std::string_view bytes);

// Generated text for a terminal: control bytes other than newline and tab (ESC, BEL, CAN, ...,
// DEL) become their visible Unicode pictures (␛, ␇, ␘, ␡), so a model's output cannot move the
// cursor, retitle the window or hide what it wrote. Everything else is unchanged.
std::string visible_controls(std::string_view text);

}  // namespace hyla
