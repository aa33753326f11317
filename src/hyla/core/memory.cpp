#include "hyla/core/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace hyla {

std::shared_ptr<void> allocate_aligned(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t alignment = bytes >= kHuge ? kHuge : 64;
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (!p) throw std::bad_alloc();
  if (alignment == kHuge) madvise(p, rounded, MADV_HUGEPAGE);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace hyla
