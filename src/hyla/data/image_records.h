#pragma once
// Image-text records for multimodal training: an image (H x W x C uint8, row-major, channel-last)
// and its caption. The caption's first prompt_bytes bytes are a prompt (a question) that earns no
// loss; the rest is the answer (all of it for a plain caption). The patch positions are the
// model's business (SPEC §7): data/image_batches.h lays a record out as a training sequence.
//
// File layout, little-endian:
//   header, 32 bytes: char[8] magic "HYLAIMG1", u32 version (2), u32 reserved (0),
//                     u64 record count N, u64 byte offset of the index
//   N records, each:  u32 height, u32 width, u32 channels, u32 caption bytes, i32 label (-1: none),
//                     u32 prompt bytes (<= caption bytes), then height*width*channels pixel bytes,
//                     then the caption (UTF-8)
//   index:            N x u64, the byte offset of each record; the file ends there
// Version 1 is the same with the prompt bytes field reserved (0); it is still read, every prompt empty.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/io/file.h"

namespace hyla {

inline constexpr uint32_t kImageRecordsVersion = 2;

struct ImageRecord {
  int32_t height = 0, width = 0, channels = 0, label = -1;
  std::span<const uint8_t> pixels;  // a view into the mapped file
  std::string_view caption;
  int32_t prompt_bytes = 0;  // caption.substr(0, prompt_bytes) is the prompt
};

class ImageRecordWriter {
 public:
  explicit ImageRecordWriter(const std::filesystem::path& path);
  void add(std::span<const uint8_t> pixels, int32_t height, int32_t width, int32_t channels, std::string_view caption,
           int32_t label = -1, int32_t prompt_bytes = 0);
  uint64_t count() const { return offsets_.size(); }
  void commit();  // writes the index and header, then moves the file into place

 private:
  AtomicFile file_;
  uint64_t position_;
  std::vector<uint64_t> offsets_;
};

class ImageRecordReader {
 public:
  // Validates the header, the index and every record's extent; errors name the file.
  explicit ImageRecordReader(const std::filesystem::path& path);
  uint64_t size() const { return offsets_.size(); }
  ImageRecord record(uint64_t i) const;

 private:
  std::shared_ptr<const MappedFile> map_;
  uint32_t version_ = 0;
  std::vector<uint64_t> offsets_;
};

}  // namespace hyla
