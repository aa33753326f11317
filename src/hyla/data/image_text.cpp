#include "hyla/data/image_text.h"

#include <string>

#include "hyla/core/error.h"

namespace hyla {

void append_image_span(const Tokenizer& tokenizer, const Image& model_image, int64_t patch_size, std::vector<int32_t>& ids) {
  HYLA_ASSERT(patch_size > 0 && model_image.height % patch_size == 0 && model_image.width % patch_size == 0);
  ids.push_back(tokenizer.special_id("<|image_start|>"));
  ids.insert(ids.end(), size_t(model_image.height / patch_size * (model_image.width / patch_size)),
             tokenizer.special_id("<|image_pad|>"));
  ids.push_back(tokenizer.special_id("<|image_end|>"));
}

std::vector<int32_t> encode_with_images(const Tokenizer& tokenizer, std::string_view text, std::span<const Image> images,
                                        int64_t patch_size, bool allow_special) {
  size_t markers = 0;
  for (size_t at = text.find(kImageMarker); at != std::string_view::npos; at = text.find(kImageMarker, at + 1)) ++markers;
  HYLA_CHECK(markers <= images.size(), "the prompt has {} {} markers but {} image{}", markers, kImageMarker,
             images.size(), images.size() == 1 ? "" : "s");
  std::vector<int32_t> ids;
  const size_t leading = images.size() - markers;
  for (size_t i = 0; i < leading; ++i) append_image_span(tokenizer, images[i], patch_size, ids);
  size_t next = leading;
  for (;;) {
    const size_t at = text.find(kImageMarker);
    tokenizer.encode_append(text.substr(0, at), allow_special, ids);
    if (at == std::string_view::npos) break;
    append_image_span(tokenizer, images[next++], patch_size, ids);
    text.remove_prefix(at + kImageMarker.size());
  }
  return ids;
}

}  // namespace hyla
