#include "hyla/infer/prefix_cache.h"

#include <algorithm>

#include "hyla/core/error.h"

namespace hyla {

struct PrefixCache::Node {
  uint64_t id = 0;
  Node* parent = nullptr;
  int64_t begin = 0, end = 0;
  std::vector<int32_t> tokens;      // [begin, end): a match is confirmed token by token
  std::vector<PromptInput> inputs;  // and input by input (those starting inside the span)
  std::vector<Node*> children;
  std::unique_ptr<std::byte[]> rows, recurrent;  // the span's latent rows; the recurrent state at end
  uint64_t last_use = 0;
  int64_t bytes = 0;
};

namespace {

// The inputs starting in rows [begin, end) of a prompt (inputs sorted by row).
std::span<const PromptInput> inputs_in(std::span<const PromptInput> inputs, int64_t begin, int64_t end) {
  const auto first = std::find_if(inputs.begin(), inputs.end(), [&](const PromptInput& in) { return in.row >= begin; });
  const auto last = std::find_if(first, inputs.end(), [&](const PromptInput& in) { return in.row >= end; });
  return {first, last};
}

}  // namespace

uint64_t content_digest(std::span<const uint8_t> bytes, uint64_t seed) {
  uint64_t h = seed;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

PrefixCache::PrefixCache(int64_t budget_bytes, int64_t interval)
    : budget_(budget_bytes), interval_(interval), root_(std::make_unique<Node>()) {
  HYLA_CHECK(interval > 0, "prompt-state reuse: the snapshot interval must be positive, got {}", interval);
}

PrefixCache::~PrefixCache() = default;

PrefixCache::Node* PrefixCache::deepest(std::span<const int32_t> tokens, std::span<const PromptInput> inputs,
                                        int64_t limit) {
  auto spells = [&](const Node& n) {
    return n.end <= limit && std::equal(n.tokens.begin(), n.tokens.end(), tokens.begin() + n.begin) &&
           std::ranges::equal(n.inputs, inputs_in(inputs, n.begin, n.end));
  };
  // Spans of siblings may overlap (a turn's end and the next interval both start at the parent's
  // end), so every matching branch is followed, without recursion: paths can be thousands deep.
  Node* best = root_.get();
  std::vector<Node*> pending{best};
  while (!pending.empty()) {
    Node* n = pending.back();
    pending.pop_back();
    if (n->end > best->end) best = n;
    for (Node* child : n->children)
      if (spells(*child)) pending.push_back(child);
  }
  return best;
}

void PrefixCache::touch(Node* node) {
  if (node == root_.get()) return;
  const bool leaf = node->children.empty();
  if (leaf) leaves_.erase({node->last_use, node});
  node->last_use = ++clock_;
  if (leaf) leaves_.insert({node->last_use, node});
}

void PrefixCache::forget(Node* leaf) {
  HYLA_ASSERT(leaf->children.empty() && leaf != root_.get());
  leaves_.erase({leaf->last_use, leaf});
  Node* parent = leaf->parent;
  std::erase(parent->children, leaf);
  if (parent->children.empty() && parent != root_.get()) {
    // The parent was last used at least as recently as its most recent descendant.
    parent->last_use = std::max(parent->last_use, leaf->last_use);
    leaves_.insert({parent->last_use, parent});
  }
  bytes_ -= leaf->bytes;
  owned_.erase(leaf->id);
}

bool PrefixCache::make_room(int64_t bytes, const Node* keep) {
  while (bytes_ + bytes > budget_) {
    auto victim = std::find_if(leaves_.begin(), leaves_.end(), [&](const auto& leaf) { return leaf.second != keep; });
    if (victim == leaves_.end()) return false;
    forget(victim->second);
  }
  return true;
}

PrefixCache::Node* PrefixCache::resume(const Cursor& cursor, std::span<const int32_t> tokens,
                                       std::span<const PromptInput> inputs, int64_t limit) {
  if (cursor.node == 0) return deepest(tokens, inputs, limit);
  const auto it = owned_.find(cursor.node);
  if (it == owned_.end()) return deepest(tokens, inputs, limit);  // evicted since
  return it->second.get();
}

int64_t PrefixCache::restore(std::span<const int32_t> tokens, std::span<const PromptInput> inputs,
                             SequenceState& state, Cursor& cursor) {
  HYLA_ASSERT(std::ranges::is_sorted(inputs, {}, &PromptInput::row));
  HYLA_ASSERT(state.length() == 0);
  Node* node = deepest(tokens, inputs, int64_t(tokens.size()) - 1);
  cursor.node = node->id;
  if (node == root_.get()) {
    ++misses_;
    return 0;
  }
  std::vector<const Node*> path;
  for (const Node* n = node; n != root_.get(); n = n->parent) path.push_back(n);
  for (auto it = path.rbegin(); it != path.rend(); ++it) state.load_rows((*it)->begin, (*it)->end, (*it)->rows.get());
  state.load_recurrent(node->recurrent.get(), node->end);
  touch(node);
  ++hits_;
  return node->end;
}

int64_t PrefixCache::cached_length(std::span<const int32_t> tokens, std::span<const PromptInput> inputs) {
  return deepest(tokens, inputs, int64_t(tokens.size()) - 1)->end;
}

void PrefixCache::store(std::span<const int32_t> tokens, std::span<const PromptInput> inputs, int64_t length,
                        const SequenceState& state, Cursor& cursor) {
  HYLA_ASSERT(state.length() == length && length <= int64_t(tokens.size()));
  if (!enabled() || length <= 0) return;
  Node* parent = resume(cursor, tokens, inputs, length);
  HYLA_ASSERT(parent->end <= length);
  if (parent->end == length) {
    touch(parent);
    return;
  }
  const auto mine = inputs_in(inputs, parent->end, length);
  for (Node* child : parent->children)  // another request with this prefix saved it already
    if (child->end == length && std::equal(child->tokens.begin(), child->tokens.end(), tokens.begin() + parent->end) &&
        std::ranges::equal(child->inputs, mine)) {
      cursor.node = child->id;
      touch(child);
      return;
    }
  const int64_t span = length - parent->end;
  const int64_t row_bytes = span * state.bytes_per_token();
  const int64_t bytes = int64_t(sizeof(Node)) + span * int64_t(sizeof(int32_t)) +
                        int64_t(mine.size() * sizeof(PromptInput)) + row_bytes + state.fixed_bytes();
  if (bytes > budget_) return;
  touch(parent);
  if (!make_room(bytes, parent)) return;
  auto node = std::make_unique<Node>();
  node->id = ++last_id_;
  node->parent = parent;
  node->begin = parent->end;
  node->end = length;
  node->tokens.assign(tokens.begin() + parent->end, tokens.begin() + length);
  node->inputs.assign(mine.begin(), mine.end());
  node->rows = std::make_unique_for_overwrite<std::byte[]>(size_t(row_bytes));
  node->recurrent = std::make_unique_for_overwrite<std::byte[]>(size_t(state.fixed_bytes()));
  state.save_rows(node->begin, node->end, node->rows.get());
  state.save_recurrent(node->recurrent.get());
  node->bytes = bytes;
  node->last_use = ++clock_;
  if (parent->children.empty()) leaves_.erase({parent->last_use, parent});
  parent->children.push_back(node.get());
  leaves_.insert({node->last_use, node.get()});
  cursor.node = node->id;
  bytes_ += bytes;
  owned_.emplace(node->id, std::move(node));
}

void PrefixCache::clear() {
  leaves_.clear();
  root_->children.clear();
  owned_.clear();
  bytes_ = 0;
}

}  // namespace hyla
