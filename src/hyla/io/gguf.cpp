#include "hyla/io/gguf.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <regex>
#include <set>

#include "hyla/core/error.h"
#include "hyla/core/half.h"
#include "hyla/core/unaligned.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hyla {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kVersion = 3;
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS

class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, std::string source) : data_(data), size_(size), source_(std::move(source)) {}
  uint64_t offset() const { return offset_; }
  const uint8_t* here() const { return data_ + offset_; }
  uint64_t left() const { return size_ - offset_; }
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
  const uint64_t count = r.get<uint64_t>(what);
  uint64_t used = 0;
  v.array = GgufArray::read(GgufValueType(element), count, r.here(), r.left(), source + ": " + what, used);
  r.take(used, what);
  return v;
}

// Bytes per element of a fixed-size type; 0 for strings.
uint64_t element_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::Bool: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    case GgufValueType::String: case GgufValueType::Array: return 0;
  }
  return 0;
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

GgufArray::GgufArray(GgufValueType element, const nlohmann::json& values) : element_(element) {
  HYLA_CHECK(values.is_array() && element != GgufValueType::Array, "GGUF array of {}: not an array of scalars",
             values.dump().substr(0, 80));
  for (const json& x : values) {
    if (element == GgufValueType::String) {
      HYLA_CHECK(x.is_string(), "GGUF array of strings: element {} is {}", count_, x.dump().substr(0, 80));
      bytes_ += x.get<std::string>();
      ends_.push_back(bytes_.size());
    } else {
      put_scalar(bytes_, element, x, "array element");
    }
    ++count_;
  }
}

GgufArray GgufArray::read(GgufValueType element, uint64_t count, const uint8_t* data, uint64_t available,
                          const std::string& what, uint64_t& used) {
  GgufArray a;
  a.element_ = element;
  a.count_ = count;
  const uint64_t size = element_bytes(element);
  if (size > 0) {  // checked before anything is copied: a lying count costs nothing
    HYLA_CHECK(count <= available / size, "{}: truncated: {} elements of {} bytes, {} bytes left in the file", what,
               count, size, available);
    used = count * size;
    if (element == GgufValueType::Bool)
      for (uint64_t i = 0; i < count; ++i)
        HYLA_CHECK(data[i] <= 1, "{}: element {} is a bool holding {}", what, i, data[i]);
    a.bytes_.assign(reinterpret_cast<const char*>(data), used);
    return a;
  }
  HYLA_CHECK(count <= available / 8, "{}: truncated: {} strings need at least {} bytes, {} bytes left in the file", what,
             count, count * 8, available);
  a.ends_.reserve(count);
  used = 0;
  for (uint64_t i = 0; i < count; ++i) {
    HYLA_CHECK(available - used >= 8, "{}: truncated at string {} of {}", what, i, count);
    const uint64_t n = load_unaligned<uint64_t>(data + used);
    used += 8;
    HYLA_CHECK(n <= available - used, "{}: truncated: string {} of {} needs {} bytes, {} are left", what, i, count, n,
               available - used);
    a.bytes_.append(reinterpret_cast<const char*>(data + used), n);
    used += n;
    a.ends_.push_back(a.bytes_.size());
  }
  return a;
}

std::string_view GgufArray::string(uint64_t i) const {
  HYLA_CHECK(element_ == GgufValueType::String && i < count_, "GGUF array: element {} of {} is not a string", i, count_);
  const uint64_t begin = i == 0 ? 0 : ends_[i - 1];
  return std::string_view(bytes_).substr(begin, ends_[i] - begin);
}

bool GgufArray::is_integer() const {
  return element_ != GgufValueType::F32 && element_ != GgufValueType::F64 && element_ != GgufValueType::Bool &&
         element_ != GgufValueType::String;
}

json GgufArray::at(uint64_t i) const {
  HYLA_CHECK(i < count_, "GGUF array: element {} of {}", i, count_);
  const char* p = bytes_.data() + i * element_bytes(element_);
  switch (element_) {
    case GgufValueType::U64: return load_unaligned<uint64_t>(p);  // may lie past int64
    case GgufValueType::F32: return load_unaligned<float>(p);
    case GgufValueType::Bool: return *p == 1;
    case GgufValueType::F64: return load_unaligned<double>(p);
    case GgufValueType::String: return std::string(string(i));
    case GgufValueType::Array: break;
    default: return integer(i);
  }
  fail("GGUF array: element type {}", uint32_t(element_));
}

int64_t GgufArray::integer(uint64_t i) const {
  HYLA_CHECK(is_integer() && i < count_, "GGUF array: element {} of {} is not an integer", i, count_);
  const char* p = bytes_.data() + i * element_bytes(element_);
  switch (element_) {
    case GgufValueType::U8: return load_unaligned<uint8_t>(p);
    case GgufValueType::I8: return load_unaligned<int8_t>(p);
    case GgufValueType::U16: return load_unaligned<uint16_t>(p);
    case GgufValueType::I16: return load_unaligned<int16_t>(p);
    case GgufValueType::U32: return load_unaligned<uint32_t>(p);
    case GgufValueType::I32: return load_unaligned<int32_t>(p);
    case GgufValueType::I64: return load_unaligned<int64_t>(p);
    default: break;
  }
  const uint64_t u = load_unaligned<uint64_t>(p);
  HYLA_CHECK(u <= uint64_t(INT64_MAX), "GGUF array: element {} is {}, past the int64 range", i, u);
  return int64_t(u);
}

void GgufArray::write(std::string& out) const {
  put<uint32_t>(out, uint32_t(element_));
  put<uint64_t>(out, count_);
  if (element_ != GgufValueType::String) {
    out += bytes_;
    return;
  }
  for (uint64_t i = 0; i < count_; ++i) {
    const std::string_view s = string(i);
    put<uint64_t>(out, s.size());
    out += s;
  }
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

fs::path gguf_shard_path(const fs::path& prefix, int shard, int count) {
  return fs::path(fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix.string(), shard + 1, count));
}

void GgufFile::read_shard(const fs::path& path, GgufMetadata& metadata, std::vector<GgufTensor>& tensors) {
  Shard shard{MappedFile::open(path)};
  const MappedFile& file = *shard.file;
  const std::string source = path.string();
  Reader r(file.data(), file.size(), source);
  HYLA_CHECK(file.size() >= 4 && r.get<uint32_t>("the magic") == kMagic, "{}: not a GGUF file (no 'GGUF' magic)",
             source);
  const uint32_t version = r.get<uint32_t>("the version");
  HYLA_CHECK(version == kVersion, "{}: GGUF version {}; hyla reads version 3", source, version);
  const uint64_t tensor_count = r.get<uint64_t>("the tensor count");
  const uint64_t kv_count = r.get<uint64_t>("the metadata count");
  HYLA_CHECK(tensor_count <= file.size() && kv_count <= file.size(),
             "{}: header claims {} tensors and {} metadata entries, more than the file can hold", source, tensor_count,
             kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = r.string(fmt::format("metadata key {}", i));
    GgufValue v = read_value(r, fmt::format("metadata '{}'", key), source);
    HYLA_CHECK(metadata.emplace(key, std::move(v)).second, "{}: metadata key '{}' appears twice", source, key);
  }
  uint64_t alignment = kGgufAlignment;
  if (auto a = metadata.find("general.alignment"); a != metadata.end()) {
    const json& v = a->second.value;
    HYLA_CHECK(a->second.type != GgufValueType::Array && v.is_number_integer() && v.get<int64_t>() > 0 &&
                   std::has_single_bit(v.get<uint64_t>()),
               "{}: general.alignment {} is not a power of two", source, v.dump());
    alignment = v.get<uint64_t>();
  }
  const size_t first = tensors.size();
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    t.name = r.string(fmt::format("tensor {}'s name", i));
    t.shard = shards_.size();
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
    HYLA_CHECK(ggml_type_readable(t.type), "{}: {} is {}, a ggml type hyla does not read", source, what,
               ggml_type_name(t.type));
    const GgmlType type = GgmlType(t.type);
    HYLA_CHECK(t.ne[0] % ggml_block_values(type) == 0, "{}: {} is {} but its first dimension {} is not a multiple of {}",
               source, what, ggml_type_name(t.type), t.ne[0], ggml_block_values(type));
    HYLA_CHECK(t.offset % alignment == 0, "{}: {} starts at offset {}, not a multiple of the alignment {}", source, what,
               t.offset, alignment);
    const uint64_t blocks = uint64_t(numel / ggml_block_values(type));
    HYLA_CHECK(blocks <= file.size() / uint64_t(ggml_block_bytes(type)),
               "{}: {} ({}, ne [{}]) would need {} blocks of {} bytes, more than the file's {} bytes", source, what,
               ggml_type_name(t.type), fmt::join(t.ne, ", "), blocks, ggml_block_bytes(type), file.size());
    t.bytes = blocks * uint64_t(ggml_block_bytes(type));
    HYLA_CHECK(index_.emplace(t.name, tensors.size()).second, "{}: {} appears twice{}", source, what,
               shards_.empty() ? "" : " in the split set");
    tensors.push_back(std::move(t));
  }
  const uint64_t data_start = align_up(r.offset(), alignment);
  HYLA_CHECK(data_start <= file.size(), "{}: truncated: the data section would start at byte {} of {}", source,
             data_start, file.size());
  shard.data = file.data() + data_start;
  const uint64_t data_bytes = file.size() - data_start;
  std::vector<const GgufTensor*> by_offset;
  for (size_t i = first; i < tensors.size(); ++i) {
    const GgufTensor& t = tensors[i];
    HYLA_CHECK(t.offset <= data_bytes && t.bytes <= data_bytes - t.offset,
               "{}: truncated: tensor '{}' ({}) needs bytes [{}, {}) of the data section, which holds {}", source,
               t.name, ggml_type_name(t.type), t.offset, t.offset + t.bytes, data_bytes);
    by_offset.push_back(&t);
  }
  // Each byte of the data section belongs to one tensor at most: an alias or an overlap would read
  // one tensor's bytes as another's.
  std::ranges::sort(by_offset, {}, &GgufTensor::offset);
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor &a = *by_offset[i - 1], &b = *by_offset[i];
    HYLA_CHECK(a.offset + a.bytes <= b.offset, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap in the data section",
               source, a.name, a.offset, a.offset + a.bytes, b.name, b.offset, b.offset + b.bytes);
  }
  shards_.push_back(std::move(shard));
}

namespace {

// split.no, split.count or split.tensors.count of a shard's metadata; -1 when absent.
int64_t split_key(const GgufMetadata& m, const std::string& key, const fs::path& path) {
  auto it = m.find(key);
  if (it == m.end()) return -1;
  HYLA_CHECK(it->second.type != GgufValueType::Array && it->second.value.is_number_integer() &&
                 it->second.value.get<int64_t>() >= 0 && it->second.value.get<int64_t>() <= 65535 * 4096LL,
             "{}: metadata '{}' is {}, not a shard number or count", path.string(), key, it->second.value.dump());
  return it->second.value.get<int64_t>();
}

// The PREFIX of PREFIX-NNNNN-of-MMMMM.gguf, with NNNNN and MMMMM; nullopt for other names.
struct ShardName {
  std::string prefix;
  int number, count;
};
std::optional<ShardName> shard_name(const fs::path& path) {
  static const std::regex pattern(R"(^(.*)-([0-9]{5})-of-([0-9]{5})\.gguf$)");
  std::smatch m;
  const std::string s = path.string();
  if (!std::regex_match(s, m, pattern)) return std::nullopt;
  return ShardName{m[1], std::stoi(m[2]), std::stoi(m[3])};
}

}  // namespace

GgufFile::GgufFile(const fs::path& path) {
  GgufMetadata named_metadata;
  std::vector<GgufTensor> named_tensors;
  read_shard(path, named_metadata, named_tensors);
  if (split_key(named_metadata, "split.count", path) <= 1) {
    metadata_ = std::move(named_metadata);
    tensors_ = std::move(named_tensors);
    return;
  }
  open_set(path, named_metadata);
}

void GgufFile::open_set(const fs::path& named, const GgufMetadata& named_metadata) {
  const int64_t count = split_key(named_metadata, "split.count", named);
  const int64_t number = split_key(named_metadata, "split.no", named);
  const int64_t total = split_key(named_metadata, "split.tensors.count", named);
  const std::optional<ShardName> name = shard_name(named);
  HYLA_CHECK(name && name->count == count && name->number == number + 1,
             "{}: shard {} of a set of {} (split.no, split.count), but not named PREFIX-{:05d}-of-{:05d}.gguf as "
             "llama-gguf-split names the shards",
             named.string(), number + 1, count, number + 1, count);
  // Read the set in order from the first shard (the named one is read again; its maps are cheap).
  shards_.clear();
  index_.clear();
  std::vector<GgufTensor> tensors;
  for (int i = 0; i < int(count); ++i) {
    const fs::path p = gguf_shard_path(name->prefix, i, int(count));
    std::error_code ec;
    HYLA_CHECK(fs::is_regular_file(p, ec), "{}: shard {} of {} of this split GGUF is missing ({} needs it)",
               p.string(), i + 1, count, named.string());
    GgufMetadata m;
    read_shard(p, m, tensors);
    HYLA_CHECK(split_key(m, "split.no", p) == i && split_key(m, "split.count", p) == count &&
                   split_key(m, "split.tensors.count", p) == total,
               "{}: not shard {} of this set: its split.no, split.count and split.tensors.count are {}, {}, {} where "
               "the set has {}, {}, {}",
               p.string(), i + 1, split_key(m, "split.no", p), split_key(m, "split.count", p),
               split_key(m, "split.tensors.count", p), i, count, total);
    if (i == 0) metadata_ = std::move(m);
  }
  HYLA_CHECK(int64_t(tensors.size()) == total, "{}: the {} shards hold {} tensors; split.tensors.count says {}",
             path().string(), count, tensors.size(), total);
  // A file named like a shard of this prefix but of another count, or numbered past it, is a
  // leftover of another set: which one was meant is not knowable.
  const fs::path dir = fs::path(name->prefix).parent_path().empty() ? fs::path(".") : fs::path(name->prefix).parent_path();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::optional<ShardName> other = shard_name(entry.path());
    if (!other || fs::path(other->prefix).filename() != fs::path(name->prefix).filename()) continue;
    HYLA_CHECK(other->count == count && other->number >= 1 && other->number <= count,
               "{}: a shard of another split of {} ({} of {}) beside the set of {} named by {}", entry.path().string(),
               fs::path(name->prefix).filename().string(), other->number, other->count, count, named.string());
  }
  tensors_ = std::move(tensors);
}

std::vector<std::shared_ptr<const MappedFile>> GgufFile::mapped_files() const {
  std::vector<std::shared_ptr<const MappedFile>> out;
  for (const Shard& s : shards_) out.push_back(s.file);
  return out;
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
    return Tensor::view(DType::F32, t.shape(), const_cast<uint8_t*>(p), mapped(t));
  Tensor out = Tensor::empty(DType::F32, t.shape());
  decode(t, 0, t.numel(), out.data<float>());
  return out;
}

void GgufFile::decode(const GgufTensor& t, int64_t first, int64_t n, float* dst) const {
  const GgmlType type = GgmlType(t.type);
  ggml_to_f32(type, data(t) + ggml_bytes(type, first), dst, n);
  if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) return;  // values, not blocks
  const int64_t block = ggml_block_values(type);
  for (int64_t i = 0; i < n; ++i)
    HYLA_CHECK(std::isfinite(dst[i]), "{}: tensor '{}' ({}): block {} decodes to {} (its scale is not finite)",
               path_of(t).string(), t.name, ggml_type_name(t.type), (first + i) / block, dst[i]);
}

namespace {
// A value as an error message shows it.
std::string shown(const GgufValue& v) {
  return v.type == GgufValueType::Array ? fmt::format("an array of {} elements", v.array.size()) : v.value.dump();
}
}  // namespace

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = metadata_.find(key);
  HYLA_CHECK(it != metadata_.end(), "{}: missing metadata key '{}'", path().string(), key);
  return it->second;
}

int64_t GgufFile::integer(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.type != GgufValueType::Array && v.value.is_number_integer(), "{}: metadata '{}' is {}, not an integer",
             path().string(), key, shown(v));
  return v.value.get<int64_t>();
}

double GgufFile::number(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.type != GgufValueType::Array && v.value.is_number(), "{}: metadata '{}' is {}, not a number",
             path().string(), key, shown(v));
  return v.value.get<double>();
}

bool GgufFile::boolean(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.value.is_boolean(), "{}: metadata '{}' is {}, not a bool", path().string(), key, shown(v));
  return v.value.get<bool>();
}

std::string GgufFile::string(const std::string& key) const {
  const GgufValue& v = value(key);
  HYLA_CHECK(v.value.is_string(), "{}: metadata '{}' is {}, not a string", path().string(), key, shown(v));
  return v.value.get<std::string>();
}

std::vector<double> GgufFile::numbers(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::Array) return {number(key)};
  std::vector<double> out;
  out.reserve(v.array.size());
  for (uint64_t i = 0; i < v.array.size(); ++i) {
    const nlohmann::json x = v.array.at(i);
    HYLA_CHECK(x.is_number(), "{}: metadata '{}' element {} is not a number", path().string(), key, i);
    out.push_back(x.get<double>());
  }
  return out;
}

std::vector<int64_t> GgufFile::integers(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.type != GgufValueType::Array) return {integer(key)};
  constexpr const char* kNames[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  HYLA_CHECK(v.array.is_integer(), "{}: metadata '{}' is an array of {}, not of integers", path().string(), key,
             kNames[uint32_t(v.array.element())]);
  std::vector<int64_t> out;
  out.reserve(v.array.size());
  try {
    for (uint64_t i = 0; i < v.array.size(); ++i) out.push_back(v.array.integer(i));
  } catch (const Error& e) {
    fail("{}: metadata '{}': {}", path().string(), key, e.what());
  }
  return out;
}

namespace {

// The header of one GGUF file: its metadata, then its tensors' names, shapes, types and offsets
// (from the data section, each aligned), padded to the alignment.
std::string gguf_header(const std::string& source, const GgufMetadata& metadata, std::vector<GgufTensor*> tensors) {
  std::string header;
  put<uint32_t>(header, kMagic);
  put<uint32_t>(header, kVersion);
  put<uint64_t>(header, tensors.size());
  put<uint64_t>(header, metadata.size());
  for (const auto& [key, v] : metadata) {
    HYLA_CHECK(key != "general.alignment", "{}: hyla writes the default alignment; 'general.alignment' is not settable",
               source);
    put_string(header, key);
    put<uint32_t>(header, uint32_t(v.type));
    if (v.type != GgufValueType::Array) {
      put_scalar(header, v.type, v.value, key);
      continue;
    }
    v.array.write(header);
  }
  uint64_t offset = 0;
  for (GgufTensor* t : tensors) {
    put_string(header, t->name);
    put<uint32_t>(header, uint32_t(t->ne.size()));
    for (int64_t n : t->ne) put<uint64_t>(header, uint64_t(n));
    put<uint32_t>(header, t->type);
    t->offset = offset;
    put<uint64_t>(header, t->offset);
    offset = align_up(offset + t->bytes, kGgufAlignment);
  }
  header.append(align_up(header.size(), kGgufAlignment) - header.size(), '\0');
  return header;
}

GgufValue u16_value(int64_t v) { return {GgufValueType::U16, v}; }
GgufValue i32_value(int64_t v) { return {GgufValueType::I32, v}; }

}  // namespace

GgufWriter::GgufWriter(const fs::path& path, const GgufMetadata& metadata, std::vector<GgufTensor> tensors,
                       uint64_t split_max_bytes)
    : source_(path.string()), tensors_(std::move(tensors)) {
  std::set<std::string> names;
  for (GgufTensor& t : tensors_) {
    HYLA_CHECK(names.insert(t.name).second, "{}: tensor '{}' given twice", source_, t.name);
    // The caller supplies the bytes: any type hyla reads back (its own exports are F32, F16, BF16,
    // Q8_0 and MXFP4, ggml_type_writable).
    HYLA_CHECK(ggml_type_readable(t.type), "{}: tensor '{}': {} is not a type hyla reads", source_, t.name,
               ggml_type_name(t.type));
    HYLA_CHECK(!t.ne.empty() && t.ne.size() <= kMaxDims && std::ranges::all_of(t.ne, [](int64_t n) { return n >= 1; }) &&
                   t.ne[0] % ggml_block_values(GgmlType(t.type)) == 0,
               "{}: tensor '{}' of {} dimensions, first {}, cannot be stored as {}", source_, t.name, t.ne.size(),
               t.ne.empty() ? 0 : t.ne[0], ggml_type_name(t.type));
    t.bytes = ggml_bytes(GgmlType(t.type), t.numel());
    t.shard = 0;
  }
  if (split_max_bytes == 0) {
    paths_ = {path};
    std::vector<GgufTensor*> all;
    for (GgufTensor& t : tensors_) all.push_back(&t);
    files_.push_back(std::make_unique<AtomicFile>(path));
    files_.back()->write(gguf_header(source_, metadata, all));
    return;
  }
  HYLA_CHECK(path.extension() == ".gguf", "{}: a split set is named PREFIX.gguf (its shards PREFIX-00001-of-…)",
             source_);
  HYLA_CHECK(!metadata.count("split.count") && !metadata.count("split.no") && !metadata.count("split.tensors.count"),
             "{}: the split.* keys are the writer's", source_);
  // Shard 0: metadata only; then as many tensors a shard as fit (at least one).
  std::vector<std::vector<GgufTensor*>> shards(1);
  uint64_t used = 0;
  for (GgufTensor& t : tensors_) {
    const uint64_t size = align_up(t.bytes, kGgufAlignment);
    if (shards.size() == 1 || (used + size > split_max_bytes && !shards.back().empty())) shards.emplace_back(), used = 0;
    t.shard = shards.size() - 1;
    shards.back().push_back(&t);
    used += size;
  }
  HYLA_CHECK(shards.size() <= 99999, "{}: {} shards; llama-gguf-split names at most 99999", source_, shards.size());
  const fs::path prefix = fs::path(path).replace_extension();
  const int count = int(shards.size());
  for (int i = 0; i < count; ++i) {
    GgufMetadata meta = i == 0 ? metadata : GgufMetadata{};
    meta["split.no"] = u16_value(i);
    meta["split.count"] = u16_value(count);
    meta["split.tensors.count"] = i32_value(int64_t(tensors_.size()));
    paths_.push_back(gguf_shard_path(prefix, i, count));
    files_.push_back(std::make_unique<AtomicFile>(paths_.back()));
    files_.back()->write(gguf_header(paths_.back().string(), meta, shards[size_t(i)]));
  }
}

void GgufWriter::write(const void* data, size_t bytes) {
  HYLA_CHECK(next_ < tensors_.size(), "{}: data written after the last tensor", source_);
  const GgufTensor& t = tensors_[next_];
  HYLA_CHECK(written_ + bytes <= t.bytes, "{}: tensor '{}' given {} bytes, it holds {}", source_, t.name,
             written_ + bytes, t.bytes);
  files_[t.shard]->write(data, bytes);
  written_ += bytes;
  if (written_ == t.bytes) finish_tensor();
}

void GgufWriter::finish_tensor() {
  const GgufTensor& t = tensors_[next_];
  const uint64_t pad = align_up(t.bytes, kGgufAlignment) - t.bytes;
  static const char zeros[kGgufAlignment] = {};
  files_[t.shard]->write(zeros, pad);
  ++next_;
  written_ = 0;
}

void GgufWriter::commit() {
  HYLA_CHECK(next_ == tensors_.size(), "{}: {} of {} tensors written", source_, next_, tensors_.size());
  for (auto& f : files_) f->commit();
}

}  // namespace hyla
