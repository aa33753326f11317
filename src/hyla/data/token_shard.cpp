#include "hyla/data/token_shard.h"

#include <bit>
#include <cstring>

#include "hyla/core/error.h"

namespace hyla {

static_assert(std::endian::native == std::endian::little, "shard files are little-endian, as is this host");

namespace {

constexpr char kMagic[8] = {'H', 'Y', 'L', 'A', 'T', 'O', 'K', '1'};
constexpr size_t kBufferBytes = size_t(1) << 20;

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

uint32_t token_bytes_for_vocab(int32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

TokenShardWriter::TokenShardWriter(const std::filesystem::path& path, int32_t vocab_size)
    : path_(path), file_(path), vocab_size_(vocab_size), token_bytes_(token_bytes_for_vocab(vocab_size)) {
  const uint8_t placeholder[kTokenShardHeaderBytes] = {};
  file_.write(placeholder, sizeof(placeholder));
  buffer_.reserve(kBufferBytes);
}

void TokenShardWriter::append(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    HYLA_ASSERT(id >= 0 && id < vocab_size_);
    if (buffer_.size() + 4 > kBufferBytes) flush();
    const size_t at = buffer_.size();
    buffer_.resize(at + token_bytes_);
    if (token_bytes_ == 2) {
      const auto v = uint16_t(id);
      std::memcpy(buffer_.data() + at, &v, 2);
    } else {
      const auto v = uint32_t(id);
      std::memcpy(buffer_.data() + at, &v, 4);
    }
  }
  count_ += ids.size();
}

void TokenShardWriter::flush() {
  file_.write(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void TokenShardWriter::commit() {
  flush();
  uint8_t header[kTokenShardHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  const uint32_t fields[4] = {kTokenShardVersion, token_bytes_, uint32_t(vocab_size_), 0};
  std::memcpy(header + 8, fields, sizeof(fields));
  std::memcpy(header + 24, &count_, 8);
  file_.write_at(0, header, sizeof(header));
  file_.commit();
}

TokenShard::TokenShard(const std::filesystem::path& path) : map_(MappedFile::open(path)) {
  const std::string name = path.string();
  const uint8_t* p = map_->data();
  HYLA_CHECK(map_->size() >= kTokenShardHeaderBytes, "{}: truncated token shard ({} bytes, the header alone is {})",
             name, map_->size(), kTokenShardHeaderBytes);
  HYLA_CHECK(std::memcmp(p, kMagic, 8) == 0, "{}: not a hyla token shard (wrong magic)", name);
  const auto version = load<uint32_t>(p + 8);
  HYLA_CHECK(version == kTokenShardVersion, "{}: token shard version {} is not supported (hyla reads {})", name,
             version, kTokenShardVersion);
  token_bytes_ = load<uint32_t>(p + 12);
  HYLA_CHECK(token_bytes_ == 2 || token_bytes_ == 4, "{}: {} bytes per token is not supported (2 or 4)", name,
             token_bytes_);
  const auto vocab = load<uint32_t>(p + 16);
  HYLA_CHECK(vocab > 0 && vocab <= uint32_t(INT32_MAX) && (token_bytes_ == 4 || vocab <= 65536),
             "{}: vocabulary size {} does not fit {}-byte ids", name, vocab, token_bytes_);
  vocab_size_ = int32_t(vocab);
  count_ = load<uint64_t>(p + 24);
  const uint64_t payload = map_->size() - kTokenShardHeaderBytes;
  HYLA_CHECK(count_ <= payload / token_bytes_,
             "{}: truncated token shard: the header says {} tokens but the file holds {} bytes of ids", name, count_,
             payload);
  HYLA_CHECK(payload == count_ * token_bytes_,
             "{}: malformed token shard: {} bytes follow the {} tokens the header declares", name,
             payload - count_ * token_bytes_, count_);
}

void TokenShard::read(uint64_t offset, std::span<int32_t> out) const {
  HYLA_ASSERT(offset <= count_ && out.size() <= count_ - offset);
  const uint8_t* p = map_->data() + kTokenShardHeaderBytes + offset * token_bytes_;
  uint32_t largest = 0;
  if (token_bytes_ == 2) {
    for (size_t i = 0; i < out.size(); ++i) {
      const auto id = load<uint16_t>(p + 2 * i);
      largest = std::max<uint32_t>(largest, id);
      out[i] = int32_t(id);
    }
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      const auto id = load<uint32_t>(p + 4 * i);
      largest = std::max(largest, id);
      out[i] = int32_t(id);
    }
  }
  HYLA_CHECK(largest < uint32_t(vocab_size_), "{}: corrupt token shard: id {} near token {} is not below the vocabulary size {}",
             path().string(), largest, offset, vocab_size_);
}

}  // namespace hyla
