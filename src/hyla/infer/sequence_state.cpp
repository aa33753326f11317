#include "hyla/infer/sequence_state.h"

#include <fmt/format.h>

#include <cstring>

#include "hyla/core/error.h"
#include "hyla/model/state_spec.h"

namespace hyla {

SequenceState::SequenceState(const Model& model, int64_t capacity, DType latent_dtype)
    : capacity_(capacity), latent_dtype_(latent_dtype) {
  HYLA_CHECK(capacity > 0, "sequence state: capacity must be positive, got {}", capacity);
  HYLA_CHECK(latent_dtype == DType::BF16 || latent_dtype == DType::F32, "sequence state: latent cache must be BF16 or F32");
  const ModelConfig& config = model.config();
  std::vector<StateSpec> specs;
  int64_t fixed_floats = 0, values_per_token = 0;
  for (LayerType type : config.layer_types) {
    const StateSpec& spec = specs.emplace_back(state_spec(config, type));
    fixed_floats += spec.fixed_floats();
    values_per_token += spec.values_per_token;
  }
  recurrent_ = Tensor::zeros(DType::F32, {fixed_floats});
  // Rows past a cache's length are never read: left untouched, a long context's pages become
  // resident only as tokens fill them.
  latent_ = Tensor::empty(latent_dtype, {values_per_token * capacity});
  fixed_bytes_ = int64_t(recurrent_.nbytes());
  bytes_per_token_ = values_per_token * int64_t(dtype_size(latent_dtype));
  float* fixed = recurrent_.data<float>();
  int64_t offset = 0;
  for (const StateSpec& spec : specs) {
    row_width_.push_back(spec.values_per_token);
    if (spec.values_per_token == 0) {
      cache_.layers.emplace_back(RecurrentState{fixed, fixed + spec.conv_tail_floats});
      fixed += spec.fixed_floats();
      continue;
    }
    HYLA_ASSERT(spec.fixed_floats() == 0);  // a layer's slot holds one kind of state (model/layer_cache.h)
    LatentCache cache;
    if (latent_dtype == DType::BF16) cache.latent_bf16 = latent_.data<bf16>() + offset;
    else cache.latent_f32 = latent_.data<float>() + offset;
    cache.capacity = capacity;
    cache_.layers.emplace_back(cache);
    offset += spec.values_per_token * capacity;
  }
}

int64_t SequenceState::length() const { return cache_.tokens; }

void SequenceState::reset() {
  std::memset(recurrent_.raw(), 0, recurrent_.nbytes());
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
  HYLA_CHECK(other.recurrent_.numel() == recurrent_.numel() && other.latent_dtype_ == latent_dtype_,
             "sequence state: copying between states of different models");
  const int64_t n = other.length();
  HYLA_CHECK(n <= capacity_, "sequence state: {} tokens do not fit a capacity of {}", n, capacity_);
  std::memcpy(recurrent_.raw(), other.recurrent_.raw(), recurrent_.nbytes());  // every recurrent state at once
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

void SequenceState::save_recurrent(std::byte* out) const { std::memcpy(out, recurrent_.raw(), size_t(fixed_bytes_)); }

void SequenceState::load_recurrent(const std::byte* in, int64_t length) {
  HYLA_ASSERT(0 <= length && length <= capacity_);
  std::memcpy(recurrent_.raw(), in, size_t(fixed_bytes_));
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
