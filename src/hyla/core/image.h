#pragma once
// An image as SPEC §7 reads it: H×W×C uint8, row-major, channel-last. Decoding files
// (data/image_file.h), records (data/image_records.h) and the model's patch embedding share it.
#include <cstdint>
#include <vector>

namespace hyla {

struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

}  // namespace hyla
