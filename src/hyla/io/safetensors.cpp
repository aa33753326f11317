#include "hyla/io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <span>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

namespace hyla {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Returns the offset of the first byte that breaks UTF-8, or npos.
size_t invalid_utf8_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = uint8_t(s[i]);
    int extra;
    uint32_t min;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xe0) == 0xc0) { extra = 1; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { extra = 2; min = 0x800; }
    else if ((c & 0xf8) == 0xf0) { extra = 3; min = 0x10000; }
    else return i;
    if (i + size_t(extra) >= s.size()) return i;  // sequence cut off by the end
    uint32_t cp = c & (0x3f >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto cc = uint8_t(s[i + k]);
      if ((cc & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += size_t(extra) + 1;
  }
  return std::string_view::npos;
}

uint64_t checked_product(const Shape& shape, uint64_t element_size, bool& overflow) {
  uint64_t n = element_size;
  overflow = false;
  for (int64_t d : shape) overflow |= __builtin_mul_overflow(n, uint64_t(d), &n);
  return n;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view text, uint64_t data_bytes, std::string_view source) {
  if (const size_t bad = invalid_utf8_offset(text); bad != std::string_view::npos)
    fail("{}: header is not valid UTF-8 (byte {} of the header)", source, bad);
  const json j = parse_json(text, fmt::format("{}: header", source));
  HYLA_CHECK(j.is_object(), "{}: header is not a JSON object", source);

  SafetensorsHeader header;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      HYLA_CHECK(value.is_object(), "{}: __metadata__ is not an object", source);
      for (const auto& [k, v] : value.items()) {
        HYLA_CHECK(v.is_string(), "{}: __metadata__['{}'] is not a string", source, k);
        header.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    HYLA_CHECK(value.is_object(), "{}: tensor '{}' is not an object", source, name);
    for (const auto& [k, v] : value.items())
      HYLA_CHECK(k == "dtype" || k == "shape" || k == "data_offsets", "{}: tensor '{}' has unknown field '{}'",
                 source, name, k);
    HYLA_CHECK(value.contains("dtype") && value["dtype"].is_string(), "{}: tensor '{}' has no string dtype",
               source, name);
    const std::string dtype_text = value["dtype"].get<std::string>();
    // F8_E8M0 (power-of-two exponents: compressed-tensors' MXFP4 scales) is read as its bytes.
    const auto dtype = dtype_text == "F8_E8M0" ? std::optional<DType>(DType::U8) : dtype_from_name(dtype_text);
    HYLA_CHECK(dtype.has_value(), "{}: tensor '{}' has unknown dtype '{}' (hyla reads F32, BF16, F16, I8, U8, F8_E8M0, I32, I64)",
               source, name, dtype_text);
    HYLA_CHECK(value.contains("shape") && value["shape"].is_array(), "{}: tensor '{}' has no shape array", source,
               name);
    const json& shape_json = value["shape"];
    HYLA_CHECK(shape_json.size() <= size_t(Shape::kMaxDims), "{}: tensor '{}' has {} dims; hyla supports at most {}",
               source, name, shape_json.size(), Shape::kMaxDims);
    Shape shape;
    for (const json& d : shape_json) {
      HYLA_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= (uint64_t(1) << 48),
                 "{}: tensor '{}' has an invalid shape entry {}", source, name, json_excerpt(d));
      shape.push_back(d.get<int64_t>());
    }
    HYLA_CHECK(value.contains("data_offsets") && value["data_offsets"].is_array() &&
                   value["data_offsets"].size() == 2 && value["data_offsets"][0].is_number_unsigned() &&
                   value["data_offsets"][1].is_number_unsigned(),
               "{}: tensor '{}' needs data_offsets [begin, end] of unsigned integers", source, name);
    const uint64_t begin = value["data_offsets"][0].get<uint64_t>(), end = value["data_offsets"][1].get<uint64_t>();
    HYLA_CHECK(begin <= end, "{}: tensor '{}' has data_offsets [{}, {}] with begin after end", source, name, begin,
               end);
    bool overflow = false;
    const uint64_t expected = checked_product(shape, dtype_size(*dtype), overflow);
    HYLA_CHECK(!overflow && expected == end - begin,
               "{}: tensor '{}' shape {} of {} needs {} bytes but data_offsets [{}, {}] span {}", source, name,
               shape.str(), dtype_text, overflow ? std::string("too many") : std::to_string(expected), begin, end,
               end - begin);
    header.tensors.push_back({name, *dtype, shape, begin, end});
  }

  std::sort(header.tensors.begin(), header.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& t : header.tensors) {
    HYLA_CHECK(t.begin >= cursor, "{}: tensor '{}' at [{}, {}] overlaps tensor '{}' ending at {}", source, t.name,
               t.begin, t.end, previous ? previous->name : "", cursor);
    HYLA_CHECK(t.begin == cursor, "{}: data is not contiguous: {} unused bytes before tensor '{}' at offset {}",
               source, t.begin - cursor, t.name, t.begin);
    cursor = t.end;
    previous = &t;
  }
  HYLA_CHECK(cursor <= data_bytes, "{}: truncated: tensor data ends at byte {} but the file holds {} data bytes",
             source, cursor, data_bytes);
  HYLA_CHECK(cursor == data_bytes, "{}: {} trailing bytes after the last tensor", source, data_bytes - cursor);
  return header;
}

SafetensorsFile::SafetensorsFile(const fs::path& path) : file_(MappedFile::open(path)) {
  const std::string source = path.string();
  const size_t size = file_->size();
  HYLA_CHECK(size >= 8, "{}: file has {} bytes, fewer than the 8-byte header length", source, size);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file_->data(), 8);  // little-endian, as is every machine hyla runs on
  HYLA_CHECK(header_bytes <= kMaxSafetensorsHeaderBytes, "{}: header length {} exceeds the 100 MB limit", source,
             header_bytes);
  HYLA_CHECK(header_bytes <= size - 8, "{}: header length {} runs past the end of the file ({} bytes)", source,
             header_bytes, size);
  const std::string_view text(reinterpret_cast<const char*>(file_->data()) + 8, header_bytes);
  header_ = parse_safetensors_header(text, size - 8 - header_bytes, source);
  data_ = file_->data() + 8 + header_bytes;
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

Tensor SafetensorsFile::get(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  HYLA_CHECK(e, "{}: no tensor named '{}'", path().string(), name);
  const uint8_t* p = data_ + e->begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e->dtype) != 0) {
    Tensor copy = Tensor::empty(e->dtype, e->shape);
    std::memcpy(copy.raw(), p, e->end - e->begin);
    return copy;
  }
  return Tensor::view(e->dtype, e->shape, const_cast<uint8_t*>(p), file_);
}

void SafetensorsFile::advise(std::string_view name, MapAdvice advice) const {
  const SafetensorsEntry* e = find(name);
  HYLA_CHECK(e, "{}: no tensor named '{}'", path().string(), name);
  file_->advise(data_ + e->begin, e->end - e->begin, advice);
}

ModelWeights::ModelWeights(const fs::path& dir) {
  const fs::path single = dir / "model.safetensors", index_path = dir / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    HYLA_CHECK(fs::exists(single), "{}: no model.safetensors or model.safetensors.index.json", dir.string());
    files_.emplace_back(single);
  } else {
    const std::string source = index_path.string();
    const json index = parse_json_file(source);
    HYLA_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               "{}: missing object 'weight_map'", source);
    std::map<std::string, size_t> shard_ids;
    std::map<std::string, std::string> wanted;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      HYLA_CHECK(shard.is_string(), "{}: weight_map['{}'] is not a file name", source, name);
      const std::string file = shard.get<std::string>();
      HYLA_CHECK(file.find('/') == std::string::npos && file.find("..") == std::string::npos,
                 "{}: weight_map['{}'] = '{}' is not a file in the model directory", source, name, file);
      wanted[name] = file;
      if (!shard_ids.count(file)) {
        shard_ids[file] = files_.size();
        files_.emplace_back(dir / file);
      }
    }
    for (const auto& [name, file] : wanted)
      HYLA_CHECK(files_[shard_ids[file]].find(name), "{}: tensor '{}' is listed in {} but {} does not hold it",
                 source, name, index_path.filename().string(), file);
    for (const SafetensorsFile& f : files_)
      for (const SafetensorsEntry& e : f.header().tensors)
        HYLA_CHECK(wanted.count(e.name) && wanted[e.name] == f.path().filename().string(),
                   "{}: tensor '{}' is not listed for this shard in {}", f.path().string(), e.name,
                   index_path.filename().string());
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    file_names_.push_back(files_[i].path().string());
    for (const SafetensorsEntry& e : files_[i].header().tensors) {
      const bool inserted = items_.emplace(e.name, Item{e, i, {}}).second;
      HYLA_CHECK(inserted, "{}: tensor '{}' appears in more than one shard", files_[i].path().string(), e.name);
    }
  }
}

void ModelWeights::add(SafetensorsEntry entry, std::string file, std::function<Tensor()> read,
                       std::shared_ptr<const std::map<std::string, std::string>> metadata, MappedBytes source) {
  HYLA_ASSERT(files_.empty());
  if (file_names_.empty() || file_names_.back() != file) file_names_.push_back(std::move(file));
  std::string name = entry.name;
  const bool inserted =
      items_.emplace(name, Item{std::move(entry), file_names_.size() - 1, std::move(read), std::move(metadata),
                                std::move(source)}).second;
  HYLA_CHECK(inserted, "{}: tensor '{}' given twice", file_names_.back(), name);
}

std::vector<std::string> ModelWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : items_) out.push_back(name);
  return out;
}

bool ModelWeights::contains(std::string_view name) const { return items_.find(name) != items_.end(); }

const ModelWeights::Item& ModelWeights::item(std::string_view name) const {
  auto it = items_.find(name);
  HYLA_CHECK(it != items_.end(), "model weights have no tensor named '{}'", name);
  return it->second;
}

const SafetensorsEntry& ModelWeights::entry(std::string_view name) const { return item(name).entry; }

Tensor ModelWeights::get(std::string_view name) const {
  const Item& i = item(name);
  if (!i.read) return files_[i.file].get(name);
  Tensor t = i.read();
  HYLA_ASSERT(t.dtype() == i.entry.dtype && t.shape() == i.entry.shape);
  return t;
}

void ModelWeights::advise(std::string_view name, MapAdvice advice) const {
  const Item& i = item(name);
  if (!i.read) files_[i.file].advise(name, advice);
  else if (i.source.file) i.source.file->advise(i.source.begin, i.source.bytes, advice);
}

const MappedBytes* ModelWeights::mapped_source(std::string_view name) const {
  const Item& i = item(name);
  return i.read && i.source.file ? &i.source : nullptr;
}

const std::string& ModelWeights::file_of(std::string_view name) const { return file_names_[item(name).file]; }

const std::map<std::string, std::string>& ModelWeights::metadata_of(std::string_view name) const {
  static const std::map<std::string, std::string> none;
  const Item& i = item(name);
  if (!i.read) return files_[i.file].header().metadata;
  return i.metadata ? *i.metadata : none;
}

size_t ModelWeights::file_count() const { return file_names_.size(); }

void ModelWeights::release_pages() const {
  for (const SafetensorsFile& f : files_) f.release_pages();
  for (const auto& m : mapped_) m->release_pages();
}

void ModelWeights::drop_cached_pages() const {
  for (const SafetensorsFile& f : files_) f.drop_cached_pages();
  for (const auto& m : mapped_) m->drop_cached_pages();
}

namespace {

struct PlannedTensor {
  std::string name;
  DType dtype;
  Shape shape;
  size_t source;  // the caller's index
};

// Lays `tensors` out largest element first (so each starts aligned to its element size), writes the
// header, then each tensor's bytes as `write_data` gives them, and renames the file into place.
void write_safetensors(const fs::path& path, std::vector<PlannedTensor> tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const PlannedTensor&, AtomicFile&)>& write_data) {
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const auto& a, const auto& b) { return dtype_size(a.dtype) > dtype_size(b.dtype); });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const PlannedTensor& t : tensors) {
    const uint64_t bytes = uint64_t(t.shape.numel()) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", std::vector<int64_t>(t.shape.begin(), t.shape.end())},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();
  AtomicFile file(path);
  file.write(&length, 8);
  file.write(text);
  for (const PlannedTensor& t : tensors) write_data(t, file);
  file.commit();
}

}  // namespace

void save_safetensors(const fs::path& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<PlannedTensor> planned;
  std::set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    HYLA_CHECK(names.insert(name).second, "{}: tensor '{}' given twice", path.string(), name);
    HYLA_CHECK(name != "__metadata__", "{}: '__metadata__' is reserved", path.string());
    planned.push_back({name, t.dtype(), t.shape(), i});
  }
  write_safetensors(path, std::move(planned), metadata, [&](const PlannedTensor& p, AtomicFile& file) {
    file.write(tensors[p.source].second.raw(), tensors[p.source].second.nbytes());
  });
}

namespace {

// The dtype save_safetensors writes a tensor of `weights` in: floating point as `dtype`, except
// the F32 scales of I8 tensors; the rest as it is.
DType stored_dtype(const ModelWeights& weights, const std::string& name, DType dtype) {
  const SafetensorsEntry& e = weights.entry(name);
  const bool floating = e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16;
  const std::string base = name.ends_with(".scale") ? name.substr(0, name.size() - 6) : "";
  const bool int8_scale = !base.empty() && weights.contains(base) && weights.entry(base).dtype == DType::I8;
  return floating && !int8_scale ? dtype : e.dtype;
}

void save_safetensors_of(const fs::path& path, const ModelWeights& weights, DType dtype,
                         std::span<const std::string> names, const std::map<std::string, std::string>& metadata) {
  HYLA_ASSERT(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16);
  std::vector<PlannedTensor> planned;
  for (const std::string& name : names)
    planned.push_back({name, stored_dtype(weights, name, dtype), weights.entry(name).shape, 0});
  write_safetensors(path, std::move(planned), metadata, [&](const PlannedTensor& p, AtomicFile& file) {
    Tensor t = weights.get(p.name);
    if (t.dtype() != p.dtype) t = t.to(p.dtype);
    file.write(t.raw(), t.nbytes());
  });
}

// Tensors `names` (of `bytes` each, in order) as dir/model.safetensors, or, past max_shard_bytes,
// as shards of consecutive tensors (a larger tensor alone) and model.safetensors.index.json;
// write_shard(path, first, last) writes tensors [first, last) into one file.
void write_sharded(const fs::path& dir, const std::vector<std::string>& names, const std::vector<uint64_t>& bytes,
                   uint64_t max_shard_bytes, const std::function<void(const fs::path&, size_t, size_t)>& write_shard) {
  std::vector<size_t> starts{0};
  uint64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (shard_bytes > 0 && shard_bytes + bytes[i] > max_shard_bytes) starts.push_back(i), shard_bytes = 0;
    shard_bytes += bytes[i], total += bytes[i];
  }
  starts.push_back(names.size());
  const size_t shards = starts.size() - 1;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (shards == 1) {
    write_shard(dir / "model.safetensors", 0, names.size());
    fs::remove(index_path);
    return;
  }
  json weight_map = json::object();
  for (size_t s = 0; s < shards; ++s) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    write_shard(dir / file, starts[s], starts[s + 1]);
    for (size_t i = starts[s]; i < starts[s + 1]; ++i) weight_map[names[i]] = file;
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic(index_path, index.dump(2) + "\n");
  fs::remove(dir / "model.safetensors");
}

}  // namespace

void save_safetensors(const fs::path& path, const ModelWeights& weights, DType dtype,
                      const std::map<std::string, std::string>& metadata) {
  save_safetensors_of(path, weights, dtype, weights.names(), metadata);
}

void save_model_weights(const fs::path& dir, const NamedTensors& tensors, uint64_t max_shard_bytes,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> names;
  std::vector<uint64_t> bytes;
  for (const auto& [name, t] : tensors) names.push_back(name), bytes.push_back(t.nbytes());
  write_sharded(dir, names, bytes, max_shard_bytes, [&](const fs::path& path, size_t first, size_t last) {
    save_safetensors(path, NamedTensors(tensors.begin() + ptrdiff_t(first), tensors.begin() + ptrdiff_t(last)),
                     metadata);
  });
}

void save_model_weights(const fs::path& dir, const ModelWeights& weights, DType dtype, uint64_t max_shard_bytes,
                        const std::map<std::string, std::string>& metadata) {
  const std::vector<std::string> names = weights.names();
  std::vector<uint64_t> bytes;
  for (const std::string& name : names)
    bytes.push_back(uint64_t(weights.entry(name).shape.numel()) * dtype_size(stored_dtype(weights, name, dtype)));
  write_sharded(dir, names, bytes, max_shard_bytes, [&](const fs::path& path, size_t first, size_t last) {
    save_safetensors_of(path, weights, dtype, std::span(names).subspan(first, last - first), metadata);
  });
}

}  // namespace hyla
