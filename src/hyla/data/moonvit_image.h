#pragma once
// The image processing of Kimi K2.5's and Kimi K3's processors (SPEC §7.2), from a decoded RGB
// image to the image the vision tower reads: the size rule of their navit_resize, Pillow's bicubic
// resize (reproduced to the byte: the official processor resizes with PIL), black padding at the
// bottom and right to whole merge windows. The tower then normalises and cuts it into patches
// (model/moonvit.h, moonvit_patchify).
#include <cstdint>
#include <string_view>

#include "hyla/core/image.h"
#include "hyla/model/config.h"

namespace hyla {

// The size an image is resized to (never larger) and the patch grid it fills once padded.
struct MoonVitSize {
  int64_t width = 0, height = 0;       // after resizing
  int64_t grid_rows = 0, grid_cols = 0;  // patches after padding: multiples of merge
  int64_t tokens(int64_t merge) const { return (grid_rows / merge) * (grid_cols / merge); }
};

// navit_resize's rule: scale = min(1, sqrt(limit / (max(1, ⌊W/P⌋)·max(1, ⌊H/P⌋))), S·P/W, S·P/H),
// sides ⌊side·scale⌋ (at least 1, at most S·P), then padded up to multiples of merge·P.
// (P = vision.patch_size, S = vision.moonvit.patch_limit_on_one_side, limit its in_patch_limit.)
MoonVitSize moonvit_size(int64_t width, int64_t height, const VisionConfig& vision);

// Pillow's Image.resize((width, height), Resampling.BICUBIC) of an 8-bit image, byte for byte:
// Keys' kernel at a = −0.5 widened by the scale when shrinking, coefficients in 22-bit fixed point,
// the horizontal pass rounded to 8 bits before the vertical one.
Image resize_like_pillow_bicubic(const Image& image, int64_t width, int64_t height);

// An RGB image resized by the rule and padded: grid_rows·P × grid_cols·P pixels. `source` names the
// image in errors (not RGB, empty).
Image moonvit_model_image(const Image& rgb, const VisionConfig& vision, std::string_view source);

}  // namespace hyla
