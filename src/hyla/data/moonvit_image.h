#pragma once
// The image processing of Kimi K2.5's and Kimi K3's processors (SPEC §7.2), from a decoded RGB
// image to the vision tower's patches: the size rule of their navit_resize, Pillow's bicubic
// resize (reproduced to the byte: the official processor resizes with PIL), zero padding at the
// bottom and right to whole merge windows, (x/255 − mean)/std, patches channel-first.
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "hyla/core/image.h"

namespace hyla {

struct MoonVitImageRules {
  int64_t patch_size = 14, merge = 2;
  int64_t in_patch_limit = 16384;           // patches an image may have after resizing
  int64_t patch_limit_on_one_side = 512;    // patches along either side
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f}, std{0.5f, 0.5f, 0.5f};
};

// The size an image is resized to (never larger) and the patch grid it fills once padded.
struct MoonVitSize {
  int64_t width = 0, height = 0;       // after resizing
  int64_t grid_rows = 0, grid_cols = 0;  // patches after padding: multiples of merge
  int64_t tokens(int64_t merge) const { return (grid_rows / merge) * (grid_cols / merge); }
};

// navit_resize's rule: scale = min(1, sqrt(limit / (max(1, ⌊W/P⌋)·max(1, ⌊H/P⌋))), S·P/W, S·P/H),
// sides ⌊side·scale⌋ (at least 1, at most S·P), then padded up to multiples of merge·P.
MoonVitSize moonvit_size(int64_t width, int64_t height, const MoonVitImageRules& rules);

// Pillow's Image.resize((width, height), Resampling.BICUBIC) of an 8-bit image, byte for byte:
// Keys' kernel at a = −0.5 widened by the scale when shrinking, coefficients in 22-bit fixed point,
// the horizontal pass rounded to 8 bits before the vertical one.
Image resize_like_pillow_bicubic(const Image& image, int64_t width, int64_t height);

// The tower's input for an RGB image: [grid_rows·grid_cols, 3·P·P] (SPEC §7.2), and its size.
// `source` names the image in errors (not RGB, empty).
std::vector<float> moonvit_patches(const Image& rgb, const MoonVitImageRules& rules, std::string_view source,
                                   MoonVitSize* size);

}  // namespace hyla
