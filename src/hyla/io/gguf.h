#pragma once
// GGUF (version 3, the container llama.cpp reads): reading by memory map, writing one tensor at a
// time, and the ggml tensor types hyla exchanges: F32, F16, BF16, Q8_0 and MXFP4. A file of any
// other type, or a malformed one, is a one-line hyla::Error that names the file and the tensor.
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

namespace hyla {

// ggml tensor types (ggml.h's enum ggml_type numbering).
enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, BF16 = 30, MXFP4 = 39 };

// "F32", "Q4_K", ... for any ggml type number (for messages); "type N" when unknown.
std::string ggml_type_name(uint32_t type);
// The types hyla reads and writes, by name ("f32", "F16", "q8_0", "mxfp4"; any case).
GgmlType ggml_type_from_name(std::string_view name);
bool ggml_type_supported(uint32_t type);
int64_t ggml_block_values(GgmlType type);  // values per block: 1, or 32 for Q8_0 and MXFP4
int64_t ggml_block_bytes(GgmlType type);   // bytes per block
// Bytes of `n` values (n a multiple of the block).
uint64_t ggml_bytes(GgmlType type, int64_t n);

// Plain references of the block codecs (ggml-quants.c's *_ref functions, bit for bit).
void dequantize_q8_0(const uint8_t* src, float* dst, int64_t n);
void quantize_q8_0(const float* src, uint8_t* dst, int64_t n);
void dequantize_mxfp4(const uint8_t* src, float* dst, int64_t n);
// ggml's MXFP4 blocks (17 bytes: the E8M0 scale, then 16 bytes whose low nibbles hold values 0-15
// and high nibbles 16-31) to and from the file form of kernels/mxfp4_gemm.h (the codes two a byte
// in order, then one scale byte per 32 values), for n values (a multiple of 32): only bits move.
void mxfp4_blocks_to_codes(const uint8_t* blocks, int64_t n, uint8_t* codes, uint8_t* scales);
void mxfp4_codes_to_blocks(const uint8_t* codes, const uint8_t* scales, int64_t n, uint8_t* blocks);
// Any supported type to f32.
void ggml_to_f32(GgmlType type, const uint8_t* src, float* dst, int64_t n);
// f32 to F32, F16, BF16 or Q8_0 (MXFP4 is written from packed MXFP4 data only).
void f32_to_ggml(GgmlType type, const float* src, uint8_t* dst, int64_t n);

// A metadata value: its GGUF value type (and element type for arrays) with the value as JSON.
enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9, U64 = 10, I64 = 11,
  F64 = 12
};
struct GgufValue {
  GgufValueType type = GgufValueType::U32;
  GgufValueType element = GgufValueType::U32;  // arrays only
  nlohmann::json value;
  static GgufValue u32(uint32_t v) { return {GgufValueType::U32, GgufValueType::U32, v}; }
  static GgufValue f32(float v) { return {GgufValueType::F32, GgufValueType::U32, v}; }
  static GgufValue boolean(bool v) { return {GgufValueType::Bool, GgufValueType::U32, v}; }
  static GgufValue string(std::string v) { return {GgufValueType::String, GgufValueType::U32, std::move(v)}; }
  static GgufValue array(GgufValueType element, nlohmann::json values) {
    return {GgufValueType::Array, element, std::move(values)};
  }
};
using GgufMetadata = std::map<std::string, GgufValue>;

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // fastest first
  uint32_t type = 0;
  uint64_t offset = 0;      // from the start of the data section
  uint64_t bytes = 0;
  int64_t numel() const;
  Shape shape() const;      // slowest first
};

class GgufFile {
 public:
  explicit GgufFile(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return file_->path(); }
  const GgufMetadata& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // an error naming the file when absent
  const uint8_t* data(const GgufTensor& t) const { return data_ + t.offset; }
  const std::shared_ptr<const MappedFile>& mapped() const { return file_; }
  // The tensor as f32 (a view when it is F32 and aligned, else a converted copy), in hyla's shape.
  Tensor to_f32(const GgufTensor& t) const;

  // Typed metadata reads; errors name the file and key.
  bool has(const std::string& key) const { return metadata_.count(key) > 0; }
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;  // integer or float types
  bool boolean(const std::string& key) const;
  std::string string(const std::string& key) const;
  std::vector<int64_t> integers(const std::string& key) const;  // an array, or a scalar as one value

 private:
  const GgufValue& value(const std::string& key) const;
  std::shared_ptr<const MappedFile> file_;
  GgufMetadata metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  const uint8_t* data_ = nullptr;
};

constexpr uint64_t kGgufAlignment = 32;

// Writes a GGUF file atomically, tensor by tensor, so that memory holds one tensor at a time: the
// header (metadata, then every tensor's name, shape and type) goes first, then each tensor's bytes
// in the declared order.
class GgufWriter {
 public:
  GgufWriter(const std::filesystem::path& path, const GgufMetadata& metadata, std::vector<GgufTensor> tensors);
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // The next tensor's bytes (exactly its size); may come in several calls.
  void write(const void* data, size_t bytes);
  void commit();

 private:
  void finish_tensor();
  std::string source_;
  AtomicFile file_;
  std::vector<GgufTensor> tensors_;
  size_t next_ = 0;
  uint64_t written_ = 0;  // of the current tensor
};

}  // namespace hyla
