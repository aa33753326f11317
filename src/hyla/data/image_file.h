#pragma once
// Image files (PNG, JPEG) in and out, and the image as the model reads it (SPEC §7). Files are
// untrusted input: sizes are checked before anything is decoded, and every failure is a one-line
// hyla::Error naming the file.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "hyla/core/image.h"
#include "hyla/model/config.h"

namespace hyla {

struct ImageLimits {
  int64_t max_bytes = 20 << 20;
  int64_t max_pixels = 4096 * 4096;
};

// PNG or JPEG (by magic bytes; anything else: "<source>: not a PNG or JPEG image"), decoded with stb_image.
// Dimensions are checked against limits BEFORE decoding (stbi_info_from_memory) so a decompression bomb is refused;
// byte size too. Channels as stored: grey -> 1, grey+alpha -> 1 (alpha composited over black), RGB -> 3, RGBA -> 3 (over black).
// Every failure is a hyla::Error naming `source` and the reason (stbi_failure_reason), never a crash.
Image decode_image(std::span<const uint8_t> bytes, std::string_view source, const ImageLimits& limits = {});
Image read_image_file(const std::filesystem::path& path, const ImageLimits& limits = {});
// PNG bytes of an image (1 or 3 channels), for reports and tests (stb_image_write to memory).
std::string encode_png(const Image& image);
// The image as the model reads it (SPEC §7); a model without a vision tower is an error naming
// --mmproj. The moonvit tower: RGB (grey copied), resized and padded
// by its processor's rule (data/moonvit_image.h). The patch embedding: converted to vision.channels (RGB->grey by BT.601 luma rounded, grey->RGB by copying),
// then, with fit = true only, downscaled (area averaging, aspect kept) to fit max_grid*patch_size on each side when larger;
// then padded with 0 at the bottom and right to multiples of patch_size. A grid still beyond max_grid is a hyla::Error:
// "<source>: a WxH image needs a RxC patch grid; this model reads at most max_grid x max_grid patches of PxP pixels (vision.max_grid), i.e. NxN pixels".
Image to_model_image(const Image& image, const VisionConfig& vision, std::string_view source, bool fit = false);
// How many <|image_pad|> positions the model image takes: (H/P)*(W/P), or for the moonvit tower its
// merged tokens (H/(m·P))*(W/(m·P)).
int64_t patch_count(const Image& model_image, const VisionConfig& vision);

}  // namespace hyla
