#include "hyla/infer/prefix_cache.h"

#include <algorithm>

#include "hyla/core/error.h"

namespace hyla {

PrefixCache::PrefixCache(int64_t budget_bytes, int64_t granularity) : budget_(budget_bytes), granularity_(granularity) {
  HYLA_CHECK(granularity > 0, "prefix cache: granularity must be positive, got {}", granularity);
}

uint64_t PrefixCache::hash(const int32_t* tokens, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < n; ++i) h = (h ^ uint32_t(tokens[i])) * 0x100000001b3ull;
  return h;
}

int64_t PrefixCache::restore(const std::vector<int32_t>& prompt, SequenceState& state) {
  const int64_t longest = (int64_t(prompt.size()) - 1) / granularity_ * granularity_;
  for (int64_t length = longest; length > 0; length -= granularity_) {
    auto [first, last] = index_.equal_range(hash(prompt.data(), length));
    for (auto it = first; it != last; ++it) {
      Entry& e = *it->second;
      if (int64_t(e.tokens.size()) != length || !std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) continue;
      state.copy_from(*e.state);
      entries_.splice(entries_.begin(), entries_, it->second);  // now most recently used
      ++hits_;
      return length;
    }
  }
  ++misses_;
  return 0;
}

void PrefixCache::store(const std::vector<int32_t>& prompt, int64_t length, const SequenceState& state,
                        const Model& model) {
  if (budget_ <= 0 || length <= 0 || length % granularity_ != 0) return;
  const uint64_t key = hash(prompt.data(), length);
  auto [first, last] = index_.equal_range(key);
  for (auto it = first; it != last; ++it)
    if (int64_t(it->second->tokens.size()) == length &&
        std::equal(it->second->tokens.begin(), it->second->tokens.end(), prompt.begin()))
      return;
  auto snapshot = std::make_unique<SequenceState>(model, length, state.latent_dtype());
  const int64_t bytes = snapshot->bytes_at(length);
  if (bytes > budget_) return;
  while (bytes_ + bytes > budget_ && !entries_.empty()) {  // evict the least recently used
    Entry& victim = entries_.back();
    auto [f, l] = index_.equal_range(hash(victim.tokens.data(), int64_t(victim.tokens.size())));
    for (auto it = f; it != l; ++it)
      if (&*it->second == &victim) {
        index_.erase(it);
        break;
      }
    bytes_ -= victim.bytes;
    entries_.pop_back();
  }
  snapshot->copy_from(state);
  entries_.push_front({std::vector<int32_t>(prompt.begin(), prompt.begin() + length), std::move(snapshot), bytes});
  index_.emplace(key, entries_.begin());
  bytes_ += bytes;
}

void PrefixCache::clear() {
  entries_.clear();
  index_.clear();
  bytes_ = 0;
}

}  // namespace hyla
