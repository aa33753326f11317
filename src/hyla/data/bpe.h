#pragma once
// Merge-rank BPE: within one piece, repeatedly merge the adjacent pair with the lowest merge rank
// (leftmost first among equal ranks), as HF `tokenizers` and GPT-2 do.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace hyla {

class MergeTable {
 public:
  struct Merge {
    int32_t rank, result;
  };
  // A pair listed twice keeps its later rank, as HF `tokenizers` does.
  void add(int32_t left, int32_t right, int32_t rank, int32_t result);
  const Merge* find(int32_t left, int32_t right) const {
    auto it = merges_.find(key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  }
  size_t size() const { return merges_.size(); }

 private:
  static uint64_t key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }
  std::unordered_map<uint64_t, Merge> merges_;
};

// Work buffers for apply_merges, reused across calls so encoding does not allocate per piece.
struct BpeScratch {
  struct Symbol {
    int32_t id, prev, next;  // id -1: merged into its left neighbour
  };
  struct Candidate {
    int32_t rank, position, left, right, result;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// Merges `ids` (one token per byte on entry) in place; returns how many tokens remain at the front.
size_t apply_merges(const MergeTable& merges, std::span<int32_t> ids, BpeScratch& scratch);

}  // namespace hyla
