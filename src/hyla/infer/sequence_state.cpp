#include "hyla/infer/sequence_state.h"

#include <fmt/format.h>

#include <cstring>

#include "hyla/core/error.h"

namespace hyla {

SequenceState::SequenceState(const Model& model, int64_t capacity, DType latent_dtype)
    : capacity_(capacity), latent_dtype_(latent_dtype) {
  HYLA_CHECK(capacity > 0, "sequence state: capacity must be positive, got {}", capacity);
  HYLA_CHECK(latent_dtype == DType::BF16 || latent_dtype == DType::F32, "sequence state: latent cache must be BF16 or F32");
  const auto mixers = model.mixers();
  int64_t kda_floats = 0, latent_values = 0;
  for (const Model::MixerRef& mixer : mixers) {
    if (auto* kda = std::get_if<const KdaMixer*>(&mixer)) kda_floats += (*kda)->conv_tail_floats() + (*kda)->state_floats();
    else latent_values += std::get<const MlaMixer*>(mixer)->cache_width() * capacity;
  }
  kda_ = Tensor::zeros(DType::F32, {std::max<int64_t>(kda_floats, 1)});
  // Rows past a cache's length are never read: left untouched, a long context's pages become
  // resident only as tokens fill them.
  latent_ = Tensor::empty(latent_dtype, {std::max<int64_t>(latent_values, 1)});
  fixed_bytes_ = kda_floats * 4;
  const int64_t element = int64_t(dtype_size(latent_dtype));
  float* k = kda_.data<float>();
  int64_t offset = 0;
  for (const Model::MixerRef& mixer : mixers) {
    if (auto* kda = std::get_if<const KdaMixer*>(&mixer)) {
      cache_.layers.emplace_back(RecurrentState{k, k + (*kda)->conv_tail_floats()});
      k += (*kda)->conv_tail_floats() + (*kda)->state_floats();
      row_width_.push_back(0);
      continue;
    }
    const int64_t width = std::get<const MlaMixer*>(mixer)->cache_width();
    LatentCache cache;
    if (latent_dtype == DType::BF16) cache.latent_bf16 = latent_.data<bf16>() + offset;
    else cache.latent_f32 = latent_.data<float>() + offset;
    cache.capacity = capacity;
    cache_.layers.emplace_back(cache);
    row_width_.push_back(width);
    offset += width * capacity;
    bytes_per_token_ += width * element;
  }
}

int64_t SequenceState::length() const { return cache_.tokens; }

void SequenceState::reset() {
  std::memset(kda_.raw(), 0, kda_.nbytes());
  for (LayerCache& layer : cache_.layers)
    if (auto* latent = std::get_if<LatentCache>(&layer)) latent->length = 0;
  cache_.tokens = 0;
}

namespace {

std::string mib(int64_t bytes) { return fmt::format("{:.2f} MiB", double(bytes) / double(1 << 20)); }

}  // namespace

std::string SequenceState::describe_memory(int64_t tokens) const {
  return fmt::format("{} fixed (KDA states and conv tails) + {} B per token (latent cache, {}) = {} at {} tokens",
                     mib(fixed_bytes_), bytes_per_token_, dtype_name(latent_dtype_), mib(bytes_at(tokens)), tokens);
}

void SequenceState::copy_from(const SequenceState& other) {
  HYLA_CHECK(other.kda_.numel() == kda_.numel() && other.latent_dtype_ == latent_dtype_,
             "sequence state: copying between states of different models");
  const int64_t n = other.length();
  HYLA_CHECK(n <= capacity_, "sequence state: {} tokens do not fit a capacity of {}", n, capacity_);
  std::memcpy(kda_.raw(), other.kda_.raw(), kda_.nbytes());  // every recurrent state at once
  const size_t element = dtype_size(latent_dtype_);
  for (size_t l = 0; l < cache_.layers.size(); ++l) {
    auto* dst = std::get_if<LatentCache>(&cache_.layers[l]);
    if (!dst) continue;
    const LatentCache& src = std::get<LatentCache>(other.cache_.layers[l]);
    const void* from = src.latent_bf16 ? static_cast<const void*>(src.latent_bf16) : src.latent_f32;
    void* to = dst->latent_bf16 ? static_cast<void*>(dst->latent_bf16) : dst->latent_f32;
    std::memcpy(to, from, size_t(n) * size_t(row_width_[l]) * element);
    dst->length = n;
  }
  cache_.tokens = n;
}

namespace {

// The address of row `token` of a latent layer's cache.
std::byte* row_address(const LatentCache& cache, int64_t token, int64_t width) {
  return cache.latent_bf16 ? reinterpret_cast<std::byte*>(cache.latent_bf16 + token * width)
                           : reinterpret_cast<std::byte*>(cache.latent_f32 + token * width);
}

}  // namespace

void SequenceState::save_rows(int64_t begin, int64_t end, std::byte* out) const {
  HYLA_ASSERT(0 <= begin && begin <= end && end <= length());
  const size_t element = dtype_size(latent_dtype_);
  for (size_t l = 0; l < cache_.layers.size(); ++l) {
    const auto* latent = std::get_if<LatentCache>(&cache_.layers[l]);
    if (!latent) continue;
    const size_t n = size_t(end - begin) * size_t(row_width_[l]) * element;
    std::memcpy(out, row_address(*latent, begin, row_width_[l]), n);
    out += n;
  }
}

void SequenceState::load_rows(int64_t begin, int64_t end, const std::byte* in) {
  HYLA_ASSERT(0 <= begin && begin <= end && end <= capacity_);
  const size_t element = dtype_size(latent_dtype_);
  for (size_t l = 0; l < cache_.layers.size(); ++l) {
    const auto* latent = std::get_if<LatentCache>(&cache_.layers[l]);
    if (!latent) continue;
    const size_t n = size_t(end - begin) * size_t(row_width_[l]) * element;
    std::memcpy(row_address(*latent, begin, row_width_[l]), in, n);
    in += n;
  }
}

void SequenceState::save_recurrent(std::byte* out) const { std::memcpy(out, kda_.raw(), size_t(fixed_bytes_)); }

void SequenceState::load_recurrent(const std::byte* in, int64_t length) {
  HYLA_ASSERT(0 <= length && length <= capacity_);
  std::memcpy(kda_.raw(), in, size_t(fixed_bytes_));
  for (LayerCache& layer : cache_.layers)
    if (auto* latent = std::get_if<LatentCache>(&layer)) latent->length = length;
  cache_.tokens = length;
}

Tensor feed(Model& model, const std::vector<int32_t>& ids, SequenceState& state, int64_t chunk, Precision precision) {
  HYLA_CHECK(!ids.empty(), "feed: no tokens");
  HYLA_CHECK(state.length() + int64_t(ids.size()) <= state.capacity(), "feed: {} tokens exceed the context of {}",
             state.length() + int64_t(ids.size()), state.capacity());
  Tensor logits;
  for (size_t at = 0; at < ids.size(); at += size_t(chunk)) {
    const size_t n = std::min(ids.size() - at, size_t(chunk));
    ModelInput in;
    in.ids.assign(ids.begin() + int64_t(at), ids.begin() + int64_t(at + n));
    in.tokens = TokenBatch::packed({int64_t(n)}, {state.length()});
    logits = model.forward(in, {.precision = precision}, std::span<SequenceCache>(&state.cache(), 1)).logits;
  }
  return logits;
}

}  // namespace hyla
