#pragma once
// Prompt-state reuse: a tree of snapshots along the prompts a scheduler has read, so a later
// request sharing a prefix starts from the deepest snapshot instead of recomputing it. Recurrent
// layers cannot skip a prefix the way an attention KV cache can be shared: their state must be
// saved at that point.
//
// A node is a span [begin, end) of one prompt's tokens below its parent's span. It holds what a
// restore needs from that span and nothing before it: the latent-attention rows of its tokens and
// the recurrent state at its end (KDA states and conv tails, fixed size). Restoring a prefix of n
// tokens copies the rows of every node on the path and the recurrent state of the last, so memory
// grows linearly with the tokens cached (rows once, plus one fixed-size state per snapshot), not
// with the square of a prompt's length as a whole-state copy per snapshot would. Snapshots sit at
// every multiple of the interval in a prompt (the scheduler ends its prefill chunks there) and at
// the end of every turn (prompt and generated tokens), so a second turn over the same document
// reads at most the interval's tokens again plus what is new. Bounded by a byte budget, leaves
// evicted least recently used first.
//
// The key is the tokens and every non-token input inside them: an image's pad tokens are the same
// for every image of its size, so its content digest is part of the key, and two prompts that
// differ only in an image's pixels never share a state.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
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
  // Snapshots every `interval` tokens of a prompt (and at turn ends), within `budget_bytes`.
  PrefixCache(int64_t budget_bytes, int64_t interval);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  int64_t interval() const { return interval_; }
  bool enabled() const { return budget_ > 0; }

  // Where a request's snapshots have reached, so its next store continues from there instead of
  // searching the tree from the root again (which would cost the prompt's length per snapshot).
  // A cursor whose node was evicted since falls back to the search.
  struct Cursor {
    uint64_t node = 0;  // 0: none yet
  };

  // The longest cached prefix of `tokens` with its `inputs` (sorted by row) matching too, shorter
  // than `tokens` (the last token must still be read for its logits), loaded into `state`, which
  // must be empty; returns its length (0: nothing reused, state untouched). Sets the cursor.
  int64_t restore(std::span<const int32_t> tokens, std::span<const PromptInput> inputs, SequenceState& state,
                  Cursor& cursor);
  // The length restore() would give, without loading anything or counting a hit.
  int64_t cached_length(std::span<const int32_t> tokens, std::span<const PromptInput> inputs);
  // Saves `state`, which holds exactly the first `length` of `tokens`, as a snapshot at `length`:
  // a node from the deepest cached prefix of those tokens (the cursor's) to `length`. Nothing is
  // added when that prefix is cached already or the node does not fit the budget.
  void store(std::span<const int32_t> tokens, std::span<const PromptInput> inputs, int64_t length,
             const SequenceState& state, Cursor& cursor);

  void clear();  // forgets every snapshot (the model's weights changed)

  int64_t bytes() const { return bytes_; }
  int64_t snapshots() const { return int64_t(owned_.size()); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  struct Node;
  // The deepest node whose path spells a prefix of tokens[0, limit) (inputs matching), or the root.
  Node* deepest(std::span<const int32_t> tokens, std::span<const PromptInput> inputs, int64_t limit);
  // The cursor's node, or deepest() when it has none or its node is gone.
  Node* resume(const Cursor& cursor, std::span<const int32_t> tokens, std::span<const PromptInput> inputs,
               int64_t limit);
  void touch(Node* node);  // marks the path to node most recently used
  // Evicts least recently used leaves (never `keep` or its ancestors) until `bytes` more fit;
  // returns whether they do.
  bool make_room(int64_t bytes, const Node* keep);
  void forget(Node* leaf);

  int64_t budget_, interval_, bytes_ = 0, hits_ = 0, misses_ = 0;
  uint64_t clock_ = 0;    // use counter: larger is more recent
  uint64_t last_id_ = 0;  // node ids count from 1; the root's is 0
  std::unique_ptr<Node> root_;  // the empty prefix
  std::unordered_map<uint64_t, std::unique_ptr<Node>> owned_;  // every other node, by id
  std::set<std::pair<uint64_t, Node*>> leaves_;  // (last use, node) of childless nodes
};

}  // namespace hyla
