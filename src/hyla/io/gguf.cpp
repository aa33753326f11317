#include "hyla/io/gguf.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "hyla/core/error.h"
#include "hyla/core/half.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hyla {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kVersion = 3;
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS

// ggml.h's enum ggml_type, for naming the types hyla does not read.
constexpr std::array<std::string_view, 43> kTypeNames = {
    "F32",     "F16",    "Q4_0",    "Q4_1",   "type 4", "type 5", "Q5_0",  "Q5_1",  "Q8_0",  "Q8_1",  "Q2_K",
    "Q3_K",    "Q4_K",   "Q5_K",    "Q6_K",   "Q8_K",   "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
    "IQ3_S",   "IQ2_S",  "IQ4_XS",  "I8",     "I16",    "I32",    "I64",   "F64",   "IQ1_M", "BF16",  "type 31",
    "type 32", "type 33", "TQ1_0",  "TQ2_0",  "type 36", "type 37", "type 38", "MXFP4", "NVFP4", "Q1_0",  "Q2_0"};

// E2M1 values doubled (ggml's kvalues_mxfp4); the block scale is then 2^(e − 128).
constexpr std::array<int8_t, 16> kMxfp4Values = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, std::string source) : data_(data), size_(size), source_(std::move(source)) {}
  uint64_t offset() const { return offset_; }
  const uint8_t* take(uint64_t bytes, std::string_view what) {
    HYLA_CHECK(bytes <= size_ - offset_, "{}: truncated: {} needs {} bytes at offset {}, the file has {}", source_, what,
               bytes, offset_, size_);
    const uint8_t* p = data_ + offset_;
    offset_ += bytes;
    return p;
  }
  template <typename T>
  T get(std::string_view what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  std::string string(std::string_view what) {
    const uint64_t n = get<uint64_t>(what);
    return {reinterpret_cast<const char*>(take(n, what)), size_t(n)};
  }

 private:
  const uint8_t* data_;
  uint64_t size_, offset_ = 0;
  std::string source_;
};

json read_scalar(Reader& r, GgufValueType type, const std::string& what, const std::string& source) {
  switch (type) {
    case GgufValueType::U8: return r.get<uint8_t>(what);
    case GgufValueType::I8: return r.get<int8_t>(what);
    case GgufValueType::U16: return r.get<uint16_t>(what);
    case GgufValueType::I16: return r.get<int16_t>(what);
    case GgufValueType::U32: return r.get<uint32_t>(what);
    case GgufValueType::I32: return r.get<int32_t>(what);
    case GgufValueType::F32: return r.get<float>(what);
    case GgufValueType::Bool: {
      const uint8_t b = r.get<uint8_t>(what);
      HYLA_CHECK(b <= 1, "{}: {} is a bool holding {}", source, what, b);
      return b == 1;
    }
    case GgufValueType::String: return r.string(what);
    case GgufValueType::U64: return r.get<uint64_t>(what);
    case GgufValueType::I64: return r.get<int64_t>(what);
    case GgufValueType::F64: return r.get<double>(what);
    case GgufValueType::Array: break;
  }
  fail("{}: {} has unknown value type {}", source, what, uint32_t(type));
}

GgufValue read_value(Reader& r, const std::string& what, const std::string& source) {
  GgufValue v;
  const uint32_t type = r.get<uint32_t>(what);
  HYLA_CHECK(type <= uint32_t(GgufValueType::F64), "{}: {} has unknown value type {}", source, what, type);
  v.type = GgufValueType(type);
  if (v.type != GgufValueType::Array) {
    v.value = read_scalar(r, v.type, what, source);
    return v;
  }
  const uint32_t element = r.get<uint32_t>(what);
  HYLA_CHECK(element <= uint32_t(GgufValueType::F64) && element != uint32_t(GgufValueType::Array),
             "{}: {} is an array of unsupported value type {}", source, what, element);
  v.element = GgufValueType(element);
  const uint64_t count = r.get<uint64_t>(what);
  v.value = json::array();
  for (uint64_t i = 0; i < count; ++i) v.value.push_back(read_scalar(r, v.element, what, source));
  return v;
}

void put_bytes(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
template <typename T>
void put(std::string& out, T v) { put_bytes(out, &v, sizeof(T)); }
void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_scalar(std::string& out, GgufValueType type, const json& v, const std::string& key) {
  HYLA_CHECK(type == GgufValueType::String ? v.is_string() : type == GgufValueType::Bool ? v.is_boolean() : v.is_number(),
             "GGUF metadata '{}': value {} does not match its type", key, v.dump());
  switch (type) {
    case GgufValueType::U8: return put<uint8_t>(out, v.get<uint8_t>());
    case GgufValueType::I8: return put<int8_t>(out, v.get<int8_t>());
    case GgufValueType::U16: return put<uint16_t>(out, v.get<uint16_t>());
    case GgufValueType::I16: return put<int16_t>(out, v.get<int16_t>());
    case GgufValueType::U32: return put<uint32_t>(out, v.get<uint32_t>());
    case GgufValueType::I32: return put<int32_t>(out, v.get<int32_t>());
    case GgufValueType::F32: return put<float>(out, v.get<float>());
    case GgufValueType::Bool: return put<uint8_t>(out, v.get<bool>() ? 1 : 0);
    case GgufValueType::String: return put_string(out, v.get<std::string>());
    case GgufValueType::U64: return put<uint64_t>(out, v.get<uint64_t>());
    case GgufValueType::I64: return put<int64_t>(out, v.get<int64_t>());
    case GgufValueType::F64: return put<double>(out, v.get<double>());
    case GgufValueType::Array: break;
  }
  fail("GGUF metadata '{}': nested arrays are not written", key);
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

std::string ggml_type_name(uint32_t type) {
  return type < kTypeNames.size() ? std::string(kTypeNames[type]) : fmt::format("type {}", type);
}

bool ggml_type_supported(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::MXFP4: return true;
  }
  return false;
}

GgmlType ggml_type_from_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::MXFP4})
    if (ggml_type_name(uint32_t(t)) == upper) return t;
  fail("GGUF type '{}': hyla reads and writes f32, f16, bf16, q8_0 and mxfp4", name);
}

int64_t ggml_block_values(GgmlType type) { return type == GgmlType::Q8_0 || type == GgmlType::MXFP4 ? 32 : 1; }

int64_t ggml_block_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 4;
    case GgmlType::F16: case GgmlType::BF16: return 2;
    case GgmlType::Q8_0: return 34;  // f16 scale + 32 int8
    case GgmlType::MXFP4: return 17; // E8M0 scale + 16 bytes of 4-bit codes
  }
  return 0;
}

uint64_t ggml_bytes(GgmlType type, int64_t n) {
  HYLA_ASSERT(n % ggml_block_values(type) == 0);
  return uint64_t(n / ggml_block_values(type)) * uint64_t(ggml_block_bytes(type));
}

void dequantize_q8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 34) {
    f16 d;
    std::memcpy(&d, src, 2);
    const float scale = to_f32(d);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = float(q[j]) * scale;
  }
}

void quantize_q8_0(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, dst += 34) {
    const float* x = src + b * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const f16 scale = to_f16(d);
    std::memcpy(dst, &scale, 2);
    for (int j = 0; j < 32; ++j) dst[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
  }
}

void dequantize_mxfp4(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, src += 17) {
    const float d = std::ldexp(1.0f, int(src[0]) - 128);
    for (int j = 0; j < 16; ++j) {
      dst[b * 32 + j] = float(kMxfp4Values[src[1 + j] & 15]) * d;
      dst[b * 32 + j + 16] = float(kMxfp4Values[src[1 + j] >> 4]) * d;
    }
  }
}

void mxfp4_blocks_to_codes(const uint8_t* blocks, int64_t n, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < n / 32; ++b, blocks += 17, codes += 16) {
    scales[b] = blocks[0];
    const uint8_t* qs = blocks + 1;
    for (int j = 0; j < 8; ++j) {
      codes[j] = uint8_t((qs[2 * j] & 15) | (qs[2 * j + 1] & 15) << 4);
      codes[8 + j] = uint8_t((qs[2 * j] >> 4) | (qs[2 * j + 1] >> 4) << 4);
    }
  }
}

void mxfp4_codes_to_blocks(const uint8_t* codes, const uint8_t* scales, int64_t n, uint8_t* blocks) {
  for (int64_t b = 0; b < n / 32; ++b, blocks += 17, codes += 16) {
    blocks[0] = scales[b];
    uint8_t* qs = blocks + 1;
    for (int j = 0; j < 8; ++j) {
      qs[2 * j] = uint8_t((codes[j] & 15) | (codes[8 + j] & 15) << 4);
      qs[2 * j + 1] = uint8_t((codes[j] >> 4) | (codes[8 + j] >> 4) << 4);
    }
  }
}

void ggml_to_f32(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    // GGUF data is aligned to 32 bytes and every slice hyla takes starts on a whole element.
    case GgmlType::F16: return convert(reinterpret_cast<const f16*>(src), dst, size_t(n));
    case GgmlType::BF16: return convert(reinterpret_cast<const bf16*>(src), dst, size_t(n));
    case GgmlType::Q8_0: return dequantize_q8_0(src, dst, n);
    case GgmlType::MXFP4: return dequantize_mxfp4(src, dst, n);
  }
}

void f32_to_ggml(GgmlType type, const float* src, uint8_t* dst, int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16: return convert(src, reinterpret_cast<f16*>(dst), size_t(n));
    case GgmlType::BF16: return convert(src, reinterpret_cast<bf16*>(dst), size_t(n));
    case GgmlType::Q8_0: return quantize_q8_0(src, dst, n);
    case GgmlType::MXFP4: break;
  }
  fail("MXFP4 is written from packed MXFP4 data, not from f32");
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

Shape GgufTensor::shape() const {
  std::vector<int64_t> dims(ne.rbegin(), ne.rend());
  return Shape(dims.begin(), dims.end());
}

GgufFile::GgufFile(const fs::path& path) : file_(MappedFile::open(path)) {
  const std::string source = path.string();
  Reader r(file_->data(), file_->size(), source);
  HYLA_CHECK(file_->size() >= 4 && r.get<uint32_t>("the magic") == kMagic, "{}: not a GGUF file (no 'GGUF' magic)",
             source);
  const uint32_t version = r.get<uint32_t>("the version");
  HYLA_CHECK(version == kVersion, "{}: GGUF version {}; hyla reads version 3", source, version);
  const uint64_t tensor_count = r.get<uint64_t>("the tensor count");
  const uint64_t kv_count = r.get<uint64_t>("the metadata count");
  HYLA_CHECK(tensor_count <= file_->size() && kv_count <= file_->size(),
             "{}: header claims {} tensors and {} metadata entries, more than the file can hold", source, tensor_count,
             kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = r.string(fmt::format("metadata key {}", i));
    GgufValue v = read_value(r, fmt::format("metadata '{}'", key), source);
    HYLA_CHECK(metadata_.emplace(key, std::move(v)).second, "{}: metadata key '{}' appears twice", source, key);
  }
  uint64_t alignment = kGgufAlignment;
  if (has("general.alignment")) {
    const int64_t a = integer("general.alignment");
    HYLA_CHECK(a > 0 && (a & (a - 1)) == 0, "{}: general.alignment {} is not a power of two", source, a);
    alignment = uint64_t(a);
  }
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    t.name = r.string(fmt::format("tensor {}'s name", i));
    const std::string what = fmt::format("tensor '{}'", t.name);
    const uint32_t dims = r.get<uint32_t>(what);
    HYLA_CHECK(dims >= 1 && dims <= kMaxDims, "{}: {} has {} dimensions (1 to 4)", source, what, dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t n = r.get<uint64_t>(what);
      HYLA_CHECK(n >= 1 && n <= uint64_t(std::numeric_limits<int64_t>::max() / numel), "{}: {} has dimension {} of size {}",
                 source, what, d, n);
      t.ne.push_back(int64_t(n));
      numel *= int64_t(n);
    }
    t.type = r.get<uint32_t>(what);
    t.offset = r.get<uint64_t>(what);
    HYLA_CHECK(ggml_type_supported(t.type),
               "{}: {} is {}; hyla reads F32, F16, BF16, Q8_0 and MXFP4 GGUF tensors (requantize the file, e.g. "
               "llama-quantize --allow-requantize … Q8_0, or convert from the original checkpoint)",
               source, what, ggml_type_name(t.type));
    const GgmlType type = GgmlType(t.type);
    HYLA_CHECK(t.ne[0] % ggml_block_values(type) == 0, "{}: {} is {} but its first dimension {} is not a multiple of {}",
               source, what, ggml_type_name(t.type), t.ne[0], ggml_block_values(type));
    HYLA_CHECK(t.offset % alignment == 0, "{}: {} starts at offset {}, not a multiple of the alignment {}", source, what,
               t.offset, alignment);
    t.bytes = ggml_bytes(type, numel);
    HYLA_CHECK(index_.emplace(t.name, tensors_.size()).second, "{}: {} appears twice", source, what);
    tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = align_up(r.offset(), alignment);
  HYLA_CHECK(data_start <= file_->size(), "{}: truncated: the data section would start at byte {} of {}", source,
             data_start, file_->size());
  data_ = file_->data() + data_start;
  const uint64_t data_bytes = file_->size() - data_start;
  for (const GgufTensor& t : tensors_)
    HYLA_CHECK(t.offset <= data_bytes && t.bytes <= data_bytes - t.offset,
               "{}: truncated: tensor '{}' needs bytes [{}, {}) of the data section, which holds {}", source, t.name,
               t.offset, t.offset + t.bytes, data_bytes);
}

const GgufTensor* GgufFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find(name);
  HYLA_CHECK(t, "{}: missing tensor '{}'", path().string(), name);
  return *t;
}

Tensor GgufFile::to_f32(const GgufTensor& t) const {
  const uint8_t* p = data(t);
  if (GgmlType(t.type) == GgmlType::F32 && reinterpret_cast<uintptr_t>(p) % 4 == 0)
    return Tensor::view(DType::F32, t.shape(), const_cast<uint8_t*>(p), file_);
  Tensor out = Tensor::empty(DType::F32, t.shape());
  ggml_to_f32(GgmlType(t.type), p, out.data<float>(), t.numel());
  return out;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = metadata_.find(key);
  HYLA_CHECK(it != metadata_.end(), "{}: missing metadata key '{}'", path().string(), key);
  return it->second;
}

int64_t GgufFile::integer(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.type != GgufValueType::Array && v.value.is_number_integer(), "{}: metadata '{}' is {}, not an integer",
             path().string(), key, v.value.dump());
  return v.value.get<int64_t>();
}

double GgufFile::number(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.type != GgufValueType::Array && v.value.is_number(), "{}: metadata '{}' is {}, not a number",
             path().string(), key, v.value.dump());
  return v.value.get<double>();
}

bool GgufFile::boolean(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.value.is_boolean(), "{}: metadata '{}' is {}, not a bool", path().string(), key, v.value.dump());
  return v.value.get<bool>();
}

std::string GgufFile::string(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.value.is_string(), "{}: metadata '{}' is {}, not a string", path().string(), key, v.value.dump());
  return v.value.get<std::string>();
}

std::vector<int64_t> GgufFile::integers(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::Array) return {integer(key)};
  std::vector<int64_t> out;
  for (const json& x : v.value) {
    HYLA_CHECK(x.is_number_integer(), "{}: metadata '{}' holds {}, not an integer", path().string(), key, x.dump());
    out.push_back(x.get<int64_t>());
  }
  return out;
}

GgufWriter::GgufWriter(const fs::path& path, const GgufMetadata& metadata, std::vector<GgufTensor> tensors)
    : source_(path.string()), file_(path), tensors_(std::move(tensors)) {
  std::string header;
  put<uint32_t>(header, kMagic);
  put<uint32_t>(header, kVersion);
  put<uint64_t>(header, tensors_.size());
  put<uint64_t>(header, metadata.size());
  for (const auto& [key, v] : metadata) {
    HYLA_CHECK(key != "general.alignment", "{}: hyla writes the default alignment; 'general.alignment' is not settable",
               source_);
    put_string(header, key);
    put<uint32_t>(header, uint32_t(v.type));
    if (v.type != GgufValueType::Array) {
      put_scalar(header, v.type, v.value, key);
      continue;
    }
    HYLA_CHECK(v.value.is_array(), "GGUF metadata '{}': not an array", key);
    put<uint32_t>(header, uint32_t(v.element));
    put<uint64_t>(header, v.value.size());
    for (const json& x : v.value) put_scalar(header, v.element, x, key);
  }
  uint64_t offset = 0;
  std::set<std::string> names;
  for (GgufTensor& t : tensors_) {
    HYLA_CHECK(names.insert(t.name).second, "{}: tensor '{}' given twice", source_, t.name);
    HYLA_CHECK(ggml_type_supported(t.type), "{}: tensor '{}': hyla does not write {}", source_, t.name,
               ggml_type_name(t.type));
    HYLA_CHECK(!t.ne.empty() && t.ne.size() <= kMaxDims && std::ranges::all_of(t.ne, [](int64_t n) { return n >= 1; }) &&
                   t.ne[0] % ggml_block_values(GgmlType(t.type)) == 0,
               "{}: tensor '{}' of {} dimensions, first {}, cannot be stored as {}", source_, t.name, t.ne.size(),
               t.ne.empty() ? 0 : t.ne[0], ggml_type_name(t.type));
    put_string(header, t.name);
    put<uint32_t>(header, uint32_t(t.ne.size()));
    for (int64_t n : t.ne) put<uint64_t>(header, uint64_t(n));
    put<uint32_t>(header, t.type);
    t.offset = offset;
    t.bytes = ggml_bytes(GgmlType(t.type), t.numel());
    put<uint64_t>(header, t.offset);
    offset = align_up(offset + t.bytes, kGgufAlignment);
  }
  header.append(align_up(header.size(), kGgufAlignment) - header.size(), '\0');
  file_.write(header);
}

void GgufWriter::write(const void* data, size_t bytes) {
  HYLA_CHECK(next_ < tensors_.size(), "{}: data written after the last tensor", source_);
  const GgufTensor& t = tensors_[next_];
  HYLA_CHECK(written_ + bytes <= t.bytes, "{}: tensor '{}' given {} bytes, it holds {}", source_, t.name,
             written_ + bytes, t.bytes);
  file_.write(data, bytes);
  written_ += bytes;
  if (written_ == t.bytes) finish_tensor();
}

void GgufWriter::finish_tensor() {
  const uint64_t pad = align_up(tensors_[next_].bytes, kGgufAlignment) - tensors_[next_].bytes;
  static const char zeros[kGgufAlignment] = {};
  file_.write(zeros, pad);
  ++next_;
  written_ = 0;
}

void GgufWriter::commit() {
  HYLA_CHECK(next_ == tensors_.size(), "{}: {} of {} tensors written", source_, next_, tensors_.size());
  file_.commit();
}

}  // namespace hyla
