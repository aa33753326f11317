#include "hyla/infer/prefix_cache.h"

#include <algorithm>

#include "hyla/core/error.h"

namespace hyla {

PrefixCache::PrefixCache(int64_t budget_bytes, int64_t granularity) : budget_(budget_bytes), granularity_(granularity) {
  HYLA_CHECK(granularity > 0, "prefix cache: granularity must be positive, got {}", granularity);
}

uint64_t content_digest(std::span<const uint8_t> bytes, uint64_t seed) {
  uint64_t h = seed;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

std::span<const PromptInput> PrefixCache::inside(std::span<const PromptInput> inputs, int64_t length) {
  const auto end = std::find_if(inputs.begin(), inputs.end(), [&](const PromptInput& in) { return in.row >= length; });
  return inputs.first(size_t(end - inputs.begin()));
}

uint64_t PrefixCache::hash(const int32_t* tokens, int64_t n, std::span<const PromptInput> inputs) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < n; ++i) h = (h ^ uint32_t(tokens[i])) * 0x100000001b3ull;
  for (const PromptInput& in : inside(inputs, n)) h = (h ^ in.digest ^ uint64_t(in.row)) * 0x100000001b3ull;
  return h;
}

bool PrefixCache::matches(const Entry& e, const std::vector<int32_t>& prompt, std::span<const PromptInput> inputs,
                          int64_t length) {
  const auto mine = inside(inputs, length);
  return int64_t(e.tokens.size()) == length && std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin()) &&
         std::equal(e.inputs.begin(), e.inputs.end(), mine.begin(), mine.end());
}

int64_t PrefixCache::restore(const std::vector<int32_t>& prompt, std::span<const PromptInput> inputs,
                             SequenceState& state) {
  HYLA_ASSERT(std::is_sorted(inputs.begin(), inputs.end(), [](auto& a, auto& b) { return a.row < b.row; }));
  const int64_t longest = (int64_t(prompt.size()) - 1) / granularity_ * granularity_;
  for (int64_t length = longest; length > 0; length -= granularity_) {
    auto [first, last] = index_.equal_range(hash(prompt.data(), length, inputs));
    for (auto it = first; it != last; ++it) {
      Entry& e = *it->second;
      if (!matches(e, prompt, inputs, length)) continue;
      state.copy_from(*e.state);
      entries_.splice(entries_.begin(), entries_, it->second);  // now most recently used
      ++hits_;
      return length;
    }
  }
  ++misses_;
  return 0;
}

void PrefixCache::store(const std::vector<int32_t>& prompt, std::span<const PromptInput> inputs, int64_t length,
                        const SequenceState& state, const Model& model) {
  if (budget_ <= 0 || length <= 0 || length % granularity_ != 0) return;
  const uint64_t key = hash(prompt.data(), length, inputs);
  auto [first, last] = index_.equal_range(key);
  for (auto it = first; it != last; ++it)
    if (matches(*it->second, prompt, inputs, length)) return;
  auto snapshot = std::make_unique<SequenceState>(model, length, state.latent_dtype());
  const int64_t bytes = snapshot->bytes_at(length);
  if (bytes > budget_) return;
  while (bytes_ + bytes > budget_ && !entries_.empty()) {  // evict the least recently used
    Entry& victim = entries_.back();
    auto [f, l] = index_.equal_range(hash(victim.tokens.data(), int64_t(victim.tokens.size()), victim.inputs));
    for (auto it = f; it != l; ++it)
      if (&*it->second == &victim) {
        index_.erase(it);
        break;
      }
    bytes_ -= victim.bytes;
    entries_.pop_back();
  }
  snapshot->copy_from(state);
  const auto kept_inputs = inside(inputs, length);
  entries_.push_front({std::vector<int32_t>(prompt.begin(), prompt.begin() + length),
                       std::vector<PromptInput>(kept_inputs.begin(), kept_inputs.end()), std::move(snapshot), bytes});
  index_.emplace(key, entries_.begin());
  bytes_ += bytes;
}

void PrefixCache::clear() {
  entries_.clear();
  index_.clear();
  bytes_ = 0;
}

}  // namespace hyla
