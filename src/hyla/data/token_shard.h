#pragma once
// Token shards: a flat file of token ids behind a small fixed header, read through a memory map.
//
// Header, 32 bytes, little-endian:
//   offset  0  char[8]  magic "HYLATOK1"
//   offset  8  u32      format version (1)
//   offset 12  u32      bytes per token: 2 (u16 ids) or 4 (u32 ids)
//   offset 16  u32      vocabulary size: every id is below it
//   offset 20  u32      reserved, 0
//   offset 24  u64      token count N
//   offset 32           N ids; the file ends there
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "hyla/io/file.h"

namespace hyla {

inline constexpr size_t kTokenShardHeaderBytes = 32;
inline constexpr uint32_t kTokenShardVersion = 1;

// u16 ids when the vocabulary fits, u32 otherwise.
uint32_t token_bytes_for_vocab(int32_t vocab_size);

class TokenShardWriter {
 public:
  TokenShardWriter(const std::filesystem::path& path, int32_t vocab_size);
  void append(std::span<const int32_t> ids);
  uint64_t count() const { return count_; }
  void commit();  // writes the header and moves the file into place

 private:
  void flush();
  std::filesystem::path path_;
  AtomicFile file_;
  int32_t vocab_size_;
  uint32_t token_bytes_;
  uint64_t count_ = 0;
  std::vector<uint8_t> buffer_;
};

class TokenShard {
 public:
  // Validates the header and the file size; errors name the file.
  explicit TokenShard(const std::filesystem::path& path);
  uint64_t size() const { return count_; }
  int32_t vocab_size() const { return vocab_size_; }
  uint32_t token_bytes() const { return token_bytes_; }
  const std::filesystem::path& path() const { return map_->path(); }
  // Copies ids [offset, offset + out.size()) into `out`; an id outside the vocabulary is an error.
  void read(uint64_t offset, std::span<int32_t> out) const;

 private:
  std::shared_ptr<const MappedFile> map_;
  uint32_t token_bytes_ = 0;
  int32_t vocab_size_ = 0;
  uint64_t count_ = 0;
};

}  // namespace hyla
