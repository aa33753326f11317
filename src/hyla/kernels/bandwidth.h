#pragma once
// The memory reference that decode-speed figures are reported against (BENCHMARKS.md), next to
// matmul.h's GEMM peak: what this machine streams from memory right now, in this process.
#include <cstddef>
#include <span>
#include <vector>

namespace hyla {

// Read bandwidth of these buffers in GB/s: the best of several passes after a warm-up one, every
// OpenMP thread reading its share of each buffer with vector loads into independent accumulators
// (a plain float sum is limited by its add latency, not by memory). Bytes are read as floats; a
// tail under 256 bytes of each buffer is skipped.
double measure_read_bandwidth_gbs(const std::vector<std::span<const std::byte>>& buffers);

// The same over a fresh 512 MB buffer.
double measure_read_bandwidth_gbs();

}  // namespace hyla
