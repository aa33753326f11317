#pragma once
// Prompt-state reuse: snapshots of a sequence's state after chunk-aligned prompt prefixes, so a
// later request sharing the prefix starts from the snapshot instead of recomputing it (recurrent
// layers cannot skip a prefix the way an attention KV cache can be shared: their state must be
// saved at that point). Bounded by a byte budget, least recently used evicted first.
//
// The key is the prefix's tokens and every non-token input inside it: an image's pad tokens are
// the same for every image of its size, so its content digest is part of the key, and two prompts
// that differ only in an image's pixels never share a state.
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "hyla/infer/sequence_state.h"

namespace hyla {

// A non-token input of a prompt (an image): the prompt row where it starts and a digest of its
// content (content_digest of its pixels and shape).
struct PromptInput {
  int64_t row = 0;
  uint64_t digest = 0;
  bool operator==(const PromptInput&) const = default;
};
// FNV-1a over bytes, chained from `seed` (to digest several fields in turn).
uint64_t content_digest(std::span<const uint8_t> bytes, uint64_t seed = 0xcbf29ce484222325ull);

class PrefixCache {
 public:
  PrefixCache(int64_t budget_bytes, int64_t granularity);
  int64_t granularity() const { return granularity_; }
  // The longest cached prefix of `prompt` with its `inputs` (sorted by row) matching too (a
  // multiple of the granularity, shorter than the prompt), copied into `state`; returns its length
  // (0: nothing reused, state untouched).
  int64_t restore(const std::vector<int32_t>& prompt, std::span<const PromptInput> inputs, SequenceState& state);
  // Saves `state`, which holds exactly the first `length` tokens of `prompt` (length a multiple of
  // the granularity), unless that prefix is cached already or does not fit the budget.
  void store(const std::vector<int32_t>& prompt, std::span<const PromptInput> inputs, int64_t length,
             const SequenceState& state, const Model& model);

  void clear();  // forgets every entry (the model's weights changed)

  int64_t bytes() const { return bytes_; }
  int64_t entries() const { return int64_t(entries_.size()); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;      // the prefix itself: a hash match is confirmed token by token
    std::vector<PromptInput> inputs;  // and input by input (those starting inside the prefix)
    std::unique_ptr<SequenceState> state;
    int64_t bytes;
  };
  using List = std::list<Entry>;
  // The inputs that start inside the first `length` rows.
  static std::span<const PromptInput> inside(std::span<const PromptInput> inputs, int64_t length);
  static uint64_t hash(const int32_t* tokens, int64_t n, std::span<const PromptInput> inputs);
  static bool matches(const Entry& e, const std::vector<int32_t>& prompt, std::span<const PromptInput> inputs,
                      int64_t length);

  int64_t budget_, granularity_, bytes_ = 0, hits_ = 0, misses_ = 0;
  List entries_;  // most recently used first
  std::unordered_multimap<uint64_t, List::iterator> index_;
};

}  // namespace hyla
