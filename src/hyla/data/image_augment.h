#pragma once
// Training-time image augmentation, drawn per record from the image sampler's seeded stream (so a
// resumed run draws the same): a horizontal mirror with probability `flip`, then a translation of
// up to `shift` pixels on each axis, uniform in [-shift, shift], the uncovered border filled with
// black (torchvision's RandomHorizontalFlip and RandomCrop with `padding = shift`). The image keeps
// its size, so its patch grid and token count do not change. Evaluation never augments.
#include <cstdint>

#include "hyla/core/image.h"
#include "hyla/core/random.h"

namespace hyla {

struct ImageAugment {
  double flip = 0;     // probability of a left-right mirror, in [0, 1]
  int64_t shift = 0;   // largest translation in pixels on each axis, >= 0
  bool any() const { return flip > 0 || shift > 0; }
};

void augment_image(const ImageAugment& augment, Rng& rng, Image& image);

}  // namespace hyla
