#include "hyla/core/workspace.h"

#include <algorithm>

#include "hyla/core/memory.h"
#include "hyla/core/threads.h"

namespace hyla {
namespace {

constexpr size_t kAlign = 64;
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Arena::Arena() : blocks_(1) {}

size_t Arena::capacity() const { return blocks_.front().capacity; }

void* Arena::take_bytes(size_t bytes) {
  const size_t n = std::max(aligned(bytes), kAlign);
  Block* block = &blocks_.back();
  if (block->used + n > block->capacity) {
    // A new block (the live ones never move): at least twice the last, so a pass overflows a few times at most.
    blocks_.push_back({});
    block = &blocks_.back();
    block->capacity = std::max(n, 2 * blocks_[blocks_.size() - 2].capacity);
    block->memory = allocate_aligned(block->capacity);
  }
  void* p = static_cast<char*>(block->memory.get()) + block->used;
  block->used += n;
  in_use_ += n;
  high_water_ = std::max(high_water_, in_use_);
  return p;
}

void Arena::rewind(Mark m) {
  blocks_.resize(m.block + 1);
  blocks_.back().used = m.used;
  in_use_ = m.in_use;
  if (m.in_use == 0 && high_water_ > blocks_.front().capacity) {
    blocks_.front().memory = allocate_aligned(high_water_);
    blocks_.front().capacity = high_water_;
  }
}

Workspace::Workspace() { arenas_.push_back(std::make_unique<Arena>()); }
Workspace::~Workspace() = default;

void Workspace::reserve() {
  const size_t n = size_t(std::max(1, num_threads()));
  while (arenas_.size() < n) arenas_.push_back(std::make_unique<Arena>());
}

size_t Workspace::bytes() const {
  size_t total = 0;
  for (const auto& arena : arenas_) total += arena->capacity();
  return total;
}

}  // namespace hyla
