#pragma once
// Images inside prompts (SPEC §7): a model image takes <|image_start|> <|image_pad|>×(H/P·W/P)
// <|image_end|> where it stands. `generate --image` places images at "<image>" markers; chat
// messages and the server's content parts place them between pieces of text (chat_template.h).
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/data/tokenizer.h"

namespace hyla {

inline constexpr std::string_view kImageMarker = "<image>";

// Appends the span of a model image (H and W multiples of patch_size).
void append_image_span(const Tokenizer& tokenizer, const Image& model_image, int64_t patch_size, std::vector<int32_t>& ids);

// `text` with each "<image>" marker replaced by the next image's span; images beyond the markers
// come first, in order, before the text. More markers than images is an error.
std::vector<int32_t> encode_with_images(const Tokenizer& tokenizer, std::string_view text, std::span<const Image> images,
                                        int64_t patch_size, bool allow_special);

}  // namespace hyla
