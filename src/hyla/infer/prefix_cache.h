#pragma once
// Prompt-state reuse: snapshots of a sequence's state after chunk-aligned prompt prefixes, so a
// later request sharing the prefix starts from the snapshot instead of recomputing it (recurrent
// layers cannot skip a prefix the way an attention KV cache can be shared: their state must be
// saved at that point). Bounded by a byte budget, least recently used evicted first.
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "hyla/infer/sequence_state.h"

namespace hyla {

class PrefixCache {
 public:
  PrefixCache(int64_t budget_bytes, int64_t granularity);
  int64_t granularity() const { return granularity_; }
  // The longest cached prefix of `prompt` (a multiple of the granularity, shorter than the prompt),
  // copied into `state`; returns its length (0: nothing reused, state untouched).
  int64_t restore(const std::vector<int32_t>& prompt, SequenceState& state);
  // Saves `state`, which holds exactly the first `length` tokens of `prompt` (length a multiple of
  // the granularity), unless that prefix is cached already or does not fit the budget.
  void store(const std::vector<int32_t>& prompt, int64_t length, const SequenceState& state, const Model& model);

  void clear();  // forgets every entry (the model's weights changed)

  int64_t bytes() const { return bytes_; }
  int64_t entries() const { return int64_t(entries_.size()); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;  // the prefix itself: a hash match is confirmed token by token
    std::unique_ptr<SequenceState> state;
    int64_t bytes;
  };
  using List = std::list<Entry>;
  static uint64_t hash(const int32_t* tokens, int64_t n);

  int64_t budget_, granularity_, bytes_ = 0, hits_ = 0, misses_ = 0;
  List entries_;  // most recently used first
  std::unordered_multimap<uint64_t, List::iterator> index_;
};

}  // namespace hyla
