#include "hyla/infer/slot_file.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "hyla/core/error.h"
#include "hyla/io/file.h"

namespace hyla {
namespace {

constexpr char kMagic[8] = {'H', 'Y', 'L', 'A', 'S', 'L', 'O', 'T'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t latent_dtype;  // 0: f32, 1: bf16
  uint64_t model;
  int64_t fixed_bytes, bytes_per_token, tokens, inputs;
  uint32_t crc;
  uint32_t zero;
};
static_assert(sizeof(Header) == 64);

struct StoredInput {
  int64_t row;
  uint64_t digest;
};
static_assert(sizeof(StoredInput) == 16);

uint32_t dtype_code(DType dtype) { return dtype == DType::BF16 ? 1 : 0; }

// zlib's crc32 takes at most 4 GiB per call.
uint32_t crc_of(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const size_t n = std::min<size_t>(bytes, size_t(1) << 30);
    crc = uint32_t(crc32(crc, p, uInt(n)));
    p += n;
    bytes -= n;
  }
  return crc;
}

}  // namespace

uint64_t model_fingerprint(const Model& model) {
  const std::string config = model.config().to_json().dump();
  uint64_t h = content_digest({reinterpret_cast<const uint8_t*>(config.data()), config.size()});
  const auto chain = [&h](const void* data, size_t bytes) {
    h = content_digest({static_cast<const uint8_t*>(data), bytes}, h);
  };
  for (const auto& p : model.params().params()) {
    chain(p->name.data(), p->name.size());
    for (int64_t d : p->shape) chain(&d, sizeof(d));
    const uint8_t storage[] = {uint8_t(p->int8_block > 0), uint8_t(p->stored_mxfp4), uint8_t(p->stored_ggml),
                               uint8_t(p->held)};
    chain(storage, sizeof(storage));
    if (p->shape.ndim() == 1 && p->held && p->value.defined()) chain(p->value.raw(), p->value.nbytes());
  }
  return h;
}

int64_t save_slot_file(const std::filesystem::path& path, uint64_t fingerprint, std::span<const int32_t> tokens,
                       std::span<const PromptInput> inputs, const SequenceState& state) {
  const int64_t n = int64_t(tokens.size());
  HYLA_ASSERT(state.length() == n);
  std::vector<StoredInput> stored;
  for (const PromptInput& in : inputs) stored.push_back({in.row, in.digest});
  auto rows = std::make_unique_for_overwrite<std::byte[]>(size_t(n * state.bytes_per_token()));
  auto recurrent = std::make_unique_for_overwrite<std::byte[]>(size_t(state.fixed_bytes()));
  state.save_rows(0, n, rows.get());
  state.save_recurrent(recurrent.get());
  const size_t token_bytes = tokens.size() * sizeof(int32_t), input_bytes = stored.size() * sizeof(StoredInput);
  const size_t row_bytes = size_t(n * state.bytes_per_token()), recurrent_bytes = size_t(state.fixed_bytes());

  Header header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.version = kVersion;
  header.latent_dtype = dtype_code(state.latent_dtype());
  header.model = fingerprint;
  header.fixed_bytes = state.fixed_bytes();
  header.bytes_per_token = state.bytes_per_token();
  header.tokens = n;
  header.inputs = int64_t(stored.size());
  uint32_t crc = crc_of(0, tokens.data(), token_bytes);
  crc = crc_of(crc, stored.data(), input_bytes);
  crc = crc_of(crc, rows.get(), row_bytes);
  header.crc = crc_of(crc, recurrent.get(), recurrent_bytes);

  AtomicFile file(path);
  file.write(&header, sizeof(header));
  file.write(tokens.data(), token_bytes);
  file.write(stored.data(), input_bytes);
  file.write(rows.get(), row_bytes);
  file.write(recurrent.get(), recurrent_bytes);
  file.commit();
  return int64_t(sizeof(header) + token_bytes + input_bytes + row_bytes + recurrent_bytes);
}

SlotContents load_slot_file(const std::filesystem::path& path, uint64_t fingerprint, int64_t vocab_size,
                            SequenceState& state, int64_t* bytes) {
  const std::string name = path.filename().string();
  std::error_code ec;
  HYLA_CHECK(std::filesystem::is_regular_file(path, ec), "slot file {}: no such file", name);
  const auto map = MappedFile::open(path);
  const size_t size = map->size();
  if (bytes) *bytes = int64_t(size);
  HYLA_CHECK(size >= sizeof(Header), "slot file {}: not a hyla slot file ({} bytes, shorter than its 64-byte header)",
             name, size);
  Header h;
  std::memcpy(&h, map->data(), sizeof(h));
  HYLA_CHECK(std::memcmp(h.magic, kMagic, sizeof(kMagic)) == 0, "slot file {}: not a hyla slot file (no HYLASLOT magic)",
             name);
  HYLA_CHECK(h.version == kVersion, "slot file {}: version {}, this build reads version {}", name, h.version, kVersion);
  HYLA_CHECK(h.model == fingerprint, "slot file {}: saved from another model (fingerprint {:016x}, this server's model "
             "is {:016x})", name, h.model, fingerprint);
  HYLA_CHECK(h.latent_dtype == dtype_code(state.latent_dtype()),
             "slot file {}: its latent cache is {}, this server's is {} (--latent-dtype)", name,
             h.latent_dtype == 1 ? "bf16" : "f32", state.latent_dtype() == DType::BF16 ? "bf16" : "f32");
  HYLA_CHECK(h.fixed_bytes == state.fixed_bytes() && h.bytes_per_token == state.bytes_per_token(),
             "slot file {}: corrupt header ({} fixed bytes and {} per token, this model's state has {} and {})", name,
             h.fixed_bytes, h.bytes_per_token, state.fixed_bytes(), state.bytes_per_token());
  HYLA_CHECK(h.tokens >= 0 && h.tokens <= state.capacity(), "slot file {}: holds {} tokens, this server's slots hold {}",
             name, h.tokens, state.capacity());
  HYLA_CHECK(h.inputs >= 0 && h.inputs <= h.tokens, "slot file {}: corrupt header ({} images in {} tokens)", name,
             h.inputs, h.tokens);
  const size_t token_bytes = size_t(h.tokens) * sizeof(int32_t), input_bytes = size_t(h.inputs) * sizeof(StoredInput);
  const size_t row_bytes = size_t(h.tokens * state.bytes_per_token()), recurrent_bytes = size_t(state.fixed_bytes());
  const size_t expected = sizeof(Header) + token_bytes + input_bytes + row_bytes + recurrent_bytes;
  HYLA_CHECK(size >= expected, "slot file {}: truncated ({} bytes, its header says {})", name, size, expected);
  HYLA_CHECK(size == expected, "slot file {}: {} bytes past its end (its header says {} bytes)", name,
             size - expected, expected);

  const std::byte* body = reinterpret_cast<const std::byte*>(map->data()) + sizeof(Header);
  HYLA_CHECK(crc_of(0, body, expected - sizeof(Header)) == h.crc, "slot file {}: corrupt (its checksum does not match)",
             name);
  SlotContents contents;
  contents.tokens.resize(size_t(h.tokens));
  std::memcpy(contents.tokens.data(), body, token_bytes);
  for (size_t i = 0; i < contents.tokens.size(); ++i)
    HYLA_CHECK(contents.tokens[i] >= 0 && contents.tokens[i] < vocab_size,
               "slot file {}: token {} is id {}, outside the vocabulary of {}", name, i, contents.tokens[i], vocab_size);
  std::vector<StoredInput> stored(size_t(h.inputs));
  std::memcpy(stored.data(), body + token_bytes, input_bytes);
  for (size_t i = 0; i < stored.size(); ++i) {
    HYLA_CHECK(stored[i].row >= 0 && stored[i].row < h.tokens && (i == 0 || stored[i].row > stored[i - 1].row),
               "slot file {}: image {} starts at row {}, not after the one before it inside {} tokens", name, i,
               stored[i].row, h.tokens);
    contents.inputs.push_back({stored[i].row, stored[i].digest});
  }
  const std::byte* rows = body + token_bytes + input_bytes;
  state.reset();
  state.load_rows(0, h.tokens, rows);
  state.load_recurrent(rows + row_bytes, h.tokens);
  map->release_pages();
  return contents;
}

}  // namespace hyla
