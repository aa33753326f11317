#pragma once
// The memory reference that decode-speed figures are reported against (BENCHMARKS.md), next to
// matmul.h's GEMM peak: what this machine streams from memory right now, in this process.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace hyla {

// Read bandwidth of these buffers in GB/s: the best of several passes after a warm-up one, every
// OpenMP thread reading its share of each buffer with vector loads into independent accumulators
// (a plain float sum is limited by its add latency, not by memory). Bytes are read as floats; a
// tail under 256 bytes of each buffer is skipped.
double measure_read_bandwidth_gbs(const std::vector<std::span<const std::byte>>& buffers);

// The same over a fresh buffer of `bytes` (default 512 MB, more than any last-level cache: the
// DRAM figure). A buffer the last-level cache holds is read from there after the warm-up pass.
double measure_read_bandwidth_gbs(size_t bytes = size_t(512) << 20);

// The last-level cache one core sees (sysfs cache index with the highest level), 0 if unknown.
int64_t last_level_cache_bytes();

}  // namespace hyla
