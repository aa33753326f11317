#include "hyla/data/image_augment.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace hyla {

void augment_image(const ImageAugment& augment, Rng& rng, Image& image) {
  const int64_t h = image.height, w = image.width, c = image.channels;
  if (augment.flip > 0 && rng.uniform() < augment.flip) {
    for (int64_t y = 0; y < h; ++y) {
      uint8_t* row = image.pixels.data() + y * w * c;
      for (int64_t x = 0; x < w / 2; ++x) std::swap_ranges(row + x * c, row + (x + 1) * c, row + (w - 1 - x) * c);
    }
  }
  if (augment.shift <= 0) return;
  const uint64_t span = uint64_t(2 * augment.shift + 1);
  const int64_t dy = int64_t(rng.below(span)) - augment.shift;
  const int64_t dx = int64_t(rng.below(span)) - augment.shift;
  if (dy == 0 && dx == 0) return;
  // Pixel (y, x) of the result is pixel (y - dy, x - dx) of the source; black where that lies outside.
  std::vector<uint8_t> shifted(image.pixels.size(), 0);
  const int64_t x_from = std::max<int64_t>(0, dx), x_to = std::min(w, w + dx);
  for (int64_t y = std::max<int64_t>(0, dy); y < std::min(h, h + dy) && x_from < x_to; ++y)
    std::memcpy(shifted.data() + (y * w + x_from) * c, image.pixels.data() + ((y - dy) * w + x_from - dx) * c,
                size_t((x_to - x_from) * c));
  image.pixels = std::move(shifted);
}

}  // namespace hyla
