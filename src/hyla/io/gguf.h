#pragma once
// GGUF (version 3, the container llama.cpp reads): reading by memory map, writing one tensor at a
// time. The tensor types are io/ggml_types.h's. A tensor of a type hyla does not read, or a
// malformed file, is a one-line hyla::Error that names the file and the tensor.
//
// Shapes: GGUF lists a tensor's dimensions fastest first (ggml's `ne`); hyla's Shape is the
// reverse (row-major, slowest first). GgufTensor::shape() gives hyla's order.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "hyla/core/tensor.h"
#include "hyla/io/file.h"
#include "hyla/io/ggml_types.h"

namespace hyla {

enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9, U64 = 10, I64 = 11,
  F64 = 12
};

// An array's elements as the file stores them: numbers and bools little-endian, back to back;
// strings concatenated, with where each ends. It takes the memory its elements take in the file,
// whatever their count (a JSON value per element took ~50 times that).
class GgufArray {
 public:
  GgufArray() = default;
  GgufArray(GgufValueType element, const nlohmann::json& values);  // values' types must match
  // Reads `count` elements from `data` (`available` bytes); fails, naming `what`, if they do not fit.
  static GgufArray read(GgufValueType element, uint64_t count, const uint8_t* data, uint64_t available,
                        const std::string& what, uint64_t& used);
  GgufValueType element() const { return element_; }
  uint64_t size() const { return count_; }
  nlohmann::json at(uint64_t i) const;  // one element as JSON
  std::string_view string(uint64_t i) const;
  bool is_integer() const;
  int64_t integer(uint64_t i) const;    // integer element types (a u64 above INT64_MAX fails)
  void write(std::string& out) const;   // the element type, the count and the elements, as GGUF stores them
  bool operator==(const GgufArray&) const = default;

 private:
  GgufValueType element_ = GgufValueType::U32;
  uint64_t count_ = 0;
  std::string bytes_;
  std::vector<uint64_t> ends_;  // strings only
};

// A metadata value: its GGUF value type, a scalar as JSON or an array.
struct GgufValue {
  GgufValueType type = GgufValueType::U32;
  nlohmann::json value;  // scalars
  GgufArray array;       // arrays
  static GgufValue u32(uint32_t v) { return {GgufValueType::U32, v}; }
  static GgufValue f32(float v) { return {GgufValueType::F32, v}; }
  static GgufValue boolean(bool v) { return {GgufValueType::Bool, v}; }
  static GgufValue string(std::string v) { return {GgufValueType::String, std::move(v)}; }
  static GgufValue of_array(GgufValueType element, const nlohmann::json& values) {
    return {GgufValueType::Array, nullptr, GgufArray(element, values)};
  }
};
using GgufMetadata = std::map<std::string, GgufValue>;

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // fastest first
  uint32_t type = 0;
  uint64_t offset = 0;      // from the start of its shard's data section
  uint64_t bytes = 0;
  size_t shard = 0;         // which file of a split set holds it
  int64_t numel() const;
  Shape shape() const;      // slowest first
};

// llama-gguf-split's file names: PREFIX-00001-of-00003.gguf for shard 0 of 3.
std::filesystem::path gguf_shard_path(const std::filesystem::path& prefix, int shard, int count);

// A GGUF file, or a set of them split by llama-gguf-split (`split.count` > 1): any shard of the set
// may be named, and the whole set is opened, its metadata read from the first shard (the others
// hold only the split.* keys) and its tensors from every shard. A missing shard, one that does not
// belong (another count, number or tensor total), a tensor in two shards, or a file named like a
// shard of the set that is not one of it is an error naming that file.
class GgufFile {
 public:
  explicit GgufFile(const std::filesystem::path& path);
  // The first (or only) file.
  const std::filesystem::path& path() const { return shards_.front().file->path(); }
  size_t shard_count() const { return shards_.size(); }
  const std::filesystem::path& path_of(const GgufTensor& t) const { return shards_[t.shard].file->path(); }
  const GgufMetadata& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // an error naming the file when absent
  const uint8_t* data(const GgufTensor& t) const { return shards_[t.shard].data + t.offset; }
  // The memory map that holds a tensor's bytes, and every map of the set.
  const std::shared_ptr<const MappedFile>& mapped(const GgufTensor& t) const { return shards_[t.shard].file; }
  std::vector<std::shared_ptr<const MappedFile>> mapped_files() const;
  // The tensor as f32 (a view when it is F32 and aligned, else a converted copy), in hyla's shape.
  Tensor to_f32(const GgufTensor& t) const;
  // Values [first, first + n) of a tensor (both multiples of its block) as f32 into dst; a block of a
  // quantised type that decodes to a non-finite value (a NaN or infinite scale) is an error naming
  // the file, the tensor, its type and the block.
  void decode(const GgufTensor& t, int64_t first, int64_t n, float* dst) const;

  // Typed metadata reads; errors name the file and key.
  bool has(const std::string& key) const { return metadata_.count(key) > 0; }
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;  // integer or float types
  bool boolean(const std::string& key) const;
  std::string string(const std::string& key) const;
  std::vector<int64_t> integers(const std::string& key) const;  // an array, or a scalar as one value
  std::vector<double> numbers(const std::string& key) const;    // an array of numbers, or a scalar as one value

 private:
  struct Shard {
    std::shared_ptr<const MappedFile> file;
    const uint8_t* data = nullptr;  // its data section
  };
  void read_shard(const std::filesystem::path& path, GgufMetadata& metadata, std::vector<GgufTensor>& tensors);
  void open_set(const std::filesystem::path& named, const GgufMetadata& named_metadata);
  const GgufValue& value(const std::string& key) const;
  std::vector<Shard> shards_;
  GgufMetadata metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

constexpr uint64_t kGgufAlignment = 32;

// Writes a GGUF file atomically, tensor by tensor, so that memory holds one tensor at a time: the
// header (metadata, then every tensor's name, shape and type) goes first, then each tensor's bytes
// in the declared order. With `split_max_bytes` > 0 it writes a split set as llama-gguf-split
// --split-max-size does, named gguf_shard_path(path without ".gguf", i, n): the first shard holds
// the metadata and no tensors (as the published sets), each further shard as many tensors as fit in
// split_max_bytes (at least one); every shard carries split.no, split.count and
// split.tensors.count. The files appear together on commit(), or not at all.
class GgufWriter {
 public:
  GgufWriter(const std::filesystem::path& path, const GgufMetadata& metadata, std::vector<GgufTensor> tensors,
             uint64_t split_max_bytes = 0);
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // The files written (one, or the shards in order).
  const std::vector<std::filesystem::path>& paths() const { return paths_; }
  // The next tensor's bytes (exactly its size); may come in several calls.
  void write(const void* data, size_t bytes);
  void commit();

 private:
  void finish_tensor();
  std::string source_;
  std::vector<std::filesystem::path> paths_;
  std::vector<std::unique_ptr<AtomicFile>> files_;  // one per shard
  std::vector<GgufTensor> tensors_;                 // GgufTensor::shard says which file
  size_t next_ = 0;
  uint64_t written_ = 0;  // of the current tensor
};

}  // namespace hyla
