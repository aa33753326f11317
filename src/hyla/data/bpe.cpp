#include "hyla/data/bpe.h"

#include <algorithm>

namespace hyla {

void MergeTable::add(int32_t left, int32_t right, int32_t rank, int32_t result) {
  merges_.insert_or_assign(key(left, right), Merge{rank, result});
}

size_t apply_merges(const MergeTable& merges, std::span<int32_t> ids, BpeScratch& scratch) {
  const auto n = int32_t(ids.size());
  if (n < 2) return size_t(n);
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.resize(size_t(n));
  heap.clear();
  // A min-heap on (rank, position): lowest rank first, leftmost first among equal ranks.
  const auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.position > b.position;
  };
  const auto push_candidate = [&](int32_t position, int32_t left, int32_t right) {
    if (const MergeTable::Merge* m = merges.find(left, right)) {
      heap.push_back({m->rank, position, left, right, m->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i < n; ++i) symbols[size_t(i)] = {ids[size_t(i)], i - 1, i + 1 < n ? i + 1 : -1};
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(i, ids[size_t(i)], ids[size_t(i + 1)]);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate c = heap.back();
    heap.pop_back();
    // Stale candidates (a side already merged into something else) no longer match their ids.
    BpeScratch::Symbol& left = symbols[size_t(c.position)];
    if (left.id != c.left || left.next < 0 || symbols[size_t(left.next)].id != c.right) continue;
    BpeScratch::Symbol& right = symbols[size_t(left.next)];
    left.id = c.result;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = c.position;
    right.id = -1;
    if (left.prev >= 0) push_candidate(left.prev, symbols[size_t(left.prev)].id, left.id);
    if (left.next >= 0) push_candidate(c.position, left.id, symbols[size_t(left.next)].id);
  }
  size_t count = 0;
  for (int32_t i = 0; i >= 0; i = symbols[size_t(i)].next) ids[count++] = symbols[size_t(i)].id;
  return count;
}

}  // namespace hyla
