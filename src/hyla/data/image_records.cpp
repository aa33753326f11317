#include "hyla/data/image_records.h"

#include <bit>
#include <cstring>

#include "hyla/core/error.h"

namespace hyla {

static_assert(std::endian::native == std::endian::little, "record files are little-endian, as is this host");

namespace {

constexpr char kMagic[8] = {'H', 'Y', 'L', 'A', 'I', 'M', 'G', '1'};
constexpr size_t kHeaderBytes = 32, kRecordHeaderBytes = 24;

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

ImageRecordWriter::ImageRecordWriter(const std::filesystem::path& path) : file_(path), position_(kHeaderBytes) {
  const uint8_t placeholder[kHeaderBytes] = {};
  file_.write(placeholder, sizeof(placeholder));
}

void ImageRecordWriter::add(std::span<const uint8_t> pixels, int32_t height, int32_t width, int32_t channels,
                            std::string_view caption, int32_t label, int32_t prompt_bytes) {
  HYLA_ASSERT(height > 0 && width > 0 && channels > 0 && pixels.size() == size_t(height) * size_t(width) * size_t(channels));
  HYLA_ASSERT(prompt_bytes >= 0 && size_t(prompt_bytes) <= caption.size());
  const uint32_t header[6] = {uint32_t(height), uint32_t(width),  uint32_t(channels),
                              uint32_t(caption.size()), uint32_t(label), uint32_t(prompt_bytes)};
  offsets_.push_back(position_);
  file_.write(header, sizeof(header));
  file_.write(pixels.data(), pixels.size());
  file_.write(caption);
  position_ += sizeof(header) + pixels.size() + caption.size();
}

void ImageRecordWriter::commit() {
  file_.write(offsets_.data(), offsets_.size() * sizeof(uint64_t));
  uint8_t header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  const uint32_t version[2] = {kImageRecordsVersion, 0};
  std::memcpy(header + 8, version, 8);
  const uint64_t counts[2] = {offsets_.size(), position_};
  std::memcpy(header + 16, counts, 16);
  file_.write_at(0, header, sizeof(header));
  file_.commit();
}

ImageRecordReader::ImageRecordReader(const std::filesystem::path& path) : map_(MappedFile::open(path)) {
  const std::string name = path.string();
  const uint8_t* p = map_->data();
  const uint64_t size = map_->size();
  HYLA_CHECK(size >= kHeaderBytes, "{}: truncated image records ({} bytes, the header alone is {})", name, size,
             kHeaderBytes);
  HYLA_CHECK(std::memcmp(p, kMagic, 8) == 0, "{}: not a hyla image record file (wrong magic)", name);
  version_ = load<uint32_t>(p + 8);
  HYLA_CHECK(version_ == 1 || version_ == kImageRecordsVersion,
             "{}: image record version {} is not supported (hyla reads 1 and {})", name, version_, kImageRecordsVersion);
  const auto count = load<uint64_t>(p + 16), index = load<uint64_t>(p + 24);
  HYLA_CHECK(index >= kHeaderBytes && index <= size && count <= (size - index) / 8 && size - index == count * 8,
             "{}: truncated or malformed image records: {} records indexed at byte {} in a {}-byte file", name, count,
             index, size);
  offsets_.resize(count);
  std::memcpy(offsets_.data(), p + index, count * 8);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t at = offsets_[i];
    HYLA_CHECK(at >= kHeaderBytes && at <= index && index - at >= kRecordHeaderBytes,
               "{}: record {} starts outside the record area", name, i);
    const uint64_t h = load<uint32_t>(p + at), w = load<uint32_t>(p + at + 4), c = load<uint32_t>(p + at + 8),
                   caption = load<uint32_t>(p + at + 12);
    HYLA_CHECK(h > 0 && w > 0 && c > 0 && h * w * c + caption <= index - at - kRecordHeaderBytes,
               "{}: record {} ({}x{}x{}, {}-byte caption) runs past the record area", name, i, h, w, c, caption);
    const uint64_t prompt = version_ == 1 ? 0 : load<uint32_t>(p + at + 20);
    HYLA_CHECK(prompt <= caption, "{}: record {} has a {}-byte prompt in a {}-byte caption", name, i, prompt, caption);
  }
}

ImageRecord ImageRecordReader::record(uint64_t i) const {
  HYLA_CHECK(i < offsets_.size(), "{}: record {} out of range ({} records)", map_->path().string(), i, offsets_.size());
  const uint8_t* p = map_->data() + offsets_[i];
  ImageRecord r;
  r.height = int32_t(load<uint32_t>(p));
  r.width = int32_t(load<uint32_t>(p + 4));
  r.channels = int32_t(load<uint32_t>(p + 8));
  const auto caption = load<uint32_t>(p + 12);
  r.label = load<int32_t>(p + 16);
  r.prompt_bytes = version_ == 1 ? 0 : int32_t(load<uint32_t>(p + 20));
  const size_t pixels = size_t(r.height) * size_t(r.width) * size_t(r.channels);
  r.pixels = {p + kRecordHeaderBytes, pixels};
  r.caption = {reinterpret_cast<const char*>(p + kRecordHeaderBytes + pixels), caption};
  return r;
}

}  // namespace hyla
