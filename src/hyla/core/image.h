#pragma once
// An image as SPEC §7 reads it: H×W×C uint8, row-major, channel-last. Decoding files
// (data/image_file.h), records (data/image_records.h) and the model's patch embedding share it.
#include <cstdint>
#include <vector>

namespace hyla {

struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
  // The size the image had before it was made the model's (0: these pixels' own): Kimi K3's prompt
  // states it (data/chat_kimi_k3.cpp's image spans).
  int64_t source_width = 0, source_height = 0;
};

}  // namespace hyla
