#pragma once
// safetensors (SPEC §8): reading by memory map with zero-copy views, atomic writing, sharded
// models with model.safetensors.index.json. Every malformed file is a one-line hyla::Error that
// names the file and the problem.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/io/file.h"
#include "hyla/io/ggml_types.h"

namespace hyla {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // byte offsets into the data section
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in data order
  std::map<std::string, std::string> metadata;
};

constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Validates a header (the JSON text after the 8-byte length) against the size of the data section
// that follows it. Errors are prefixed with `source` (the file name).
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_bytes, std::string_view source);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  const SafetensorsHeader& header() const { return header_; }
  const std::filesystem::path& path() const { return file_->path(); }
  const SafetensorsEntry* find(std::string_view name) const;
  // A view into the mapped file; copied only when the data is not aligned to its element size.
  Tensor get(std::string_view name) const;
  void advise(std::string_view name, MapAdvice advice) const;  // MappedFile::advise of the tensor's bytes
  void release_pages() const { file_->release_pages(); }          // MappedFile's
  void drop_cached_pages() const { file_->drop_cached_pages(); }  // MappedFile's

 private:
  std::shared_ptr<const MappedFile> file_;
  SafetensorsHeader header_;
  const uint8_t* data_ = nullptr;
  std::map<std::string, size_t, std::less<>> index_;
};

// Bytes of a memory map that a tensor is read from.
struct MappedBytes {
  std::shared_ptr<const MappedFile> file;
  const uint8_t* begin = nullptr;
  size_t bytes = 0;
  // The bytes are ggml blocks of this type (io/ggml_types.h). For MXFP4 the tensor is their codes
  // or scales, which a reader may pack as they are (mxfp4_pack_blocks) rather than get() each half
  // converted; for the other quantised types the tensor is the blocks themselves (U8, one row of
  // blocks per row of the matrix), which products read where they lie (kernels/ggml_gemm.h).
  std::optional<GgmlType> ggml_blocks;
};

// The weights of a model: a model directory's model.safetensors, or the shards that
// model.safetensors.index.json names (each tensor in exactly one shard); or tensors another format
// provides (a GGUF file, model/gguf_model.h), each read, and converted where needed, on demand.
class ModelWeights {
 public:
  explicit ModelWeights(const std::filesystem::path& dir);
  // For tensors from another format, added with add().
  ModelWeights() = default;
  // A tensor `read` produces on demand, with the dtype and shape it will have; `entry.end -
  // entry.begin` its stored bytes; `file` names its source in messages.
  // `metadata` plays the part of a safetensors file's __metadata__ (e.g. int8 tensors' block).
  // `source`: the bytes `read` reads in a memory map, if any (for advise).
  void add(SafetensorsEntry entry, std::string file, std::function<Tensor()> read,
           std::shared_ptr<const std::map<std::string, std::string>> metadata = nullptr, MappedBytes source = {});
  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const;
  const SafetensorsEntry& entry(std::string_view name) const;
  Tensor get(std::string_view name) const;
  // MappedFile::advise of the bytes a tensor is read from, where they are in a memory map (a no-op
  // for tensors computed without one).
  void advise(std::string_view name, MapAdvice advice) const;
  // The mapped bytes an added tensor is read from (null where there are none, and for safetensors
  // files, whose get() is a view of the map already).
  const MappedBytes* mapped_source(std::string_view name) const;
  // The file that holds a tensor (for messages), and that file's safetensors __metadata__ (empty
  // for other formats).
  const std::string& file_of(std::string_view name) const;
  const std::map<std::string, std::string>& metadata_of(std::string_view name) const;
  size_t file_count() const;
  // The safetensors files (none when the tensors come from another format).
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // Unmaps the files' pages from this process, or also drops them from the page cache (a
  // cold-cache benchmark); MappedFile's.
  void release_pages() const;
  void drop_cached_pages() const;
  // A memory map whose pages release_pages() and drop_cached_pages() also drop.
  void keep_mapped(std::shared_ptr<const MappedFile> file) { mapped_.push_back(std::move(file)); }

 private:
  struct Item {
    SafetensorsEntry entry;
    size_t file = 0;                  // index into files_, or into file_names_ for added tensors
    std::function<Tensor()> read;     // added tensors only
    std::shared_ptr<const std::map<std::string, std::string>> metadata;  // added tensors only
    MappedBytes source;                                                   // added tensors only
  };
  const Item& item(std::string_view name) const;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> file_names_;
  std::vector<std::shared_ptr<const MappedFile>> mapped_;
  std::map<std::string, Item, std::less<>> items_;
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes one safetensors file atomically. Tensors are laid out largest element size first so
// every tensor starts aligned to its element size.
void save_safetensors(const std::filesystem::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes one safetensors file atomically from `weights`, reading one tensor at a time, so that
// memory holds one tensor whatever the model's size. Floating-point tensors are converted to
// `dtype` (F32, BF16 or F16) except the F32 scales of I8 tensors; I8 tensors are written as they are.
void save_safetensors(const std::filesystem::path& path, const ModelWeights& weights, DType dtype,
                      const std::map<std::string, std::string>& metadata = {});

// Writes `dir`/model.safetensors, or, when the tensors exceed `max_shard_bytes`, shards
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
void save_model_weights(const std::filesystem::path& dir, const NamedTensors& tensors,
                        uint64_t max_shard_bytes = 4ull << 30,
                        const std::map<std::string, std::string>& metadata = {});
// The same from `weights` in the order of names(), reading one tensor at a time and converting as
// save_safetensors does: a model of any size, written holding a tensor.
void save_model_weights(const std::filesystem::path& dir, const ModelWeights& weights, DType dtype,
                        uint64_t max_shard_bytes = 4ull << 30,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace hyla
