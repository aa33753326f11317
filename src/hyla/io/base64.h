#pragma once
// Base64 (RFC 4648, standard alphabet, padded): images in data URLs and in self-contained reports.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hyla {

std::string base64_encode(std::string_view bytes);
// Refuses characters outside the alphabet, misplaced padding and lengths that are not a multiple
// of 4 (hyla::Error naming `source`); ASCII whitespace is skipped, as MIME writers wrap lines.
std::vector<uint8_t> base64_decode(std::string_view text, std::string_view source);

}  // namespace hyla
