#pragma once
#include <cstddef>
#include <memory>

namespace hyla {

// 64-byte aligned, uninitialised memory. Buffers of 2 MB and more are 2 MB aligned and advised
// for transparent huge pages: on the VMs we run on, first-touching a 4 KB page costs ~8 us, so a
// 1 GB buffer touched page by page would spend seconds in the kernel.
std::shared_ptr<void> allocate_aligned(size_t bytes);

}  // namespace hyla
