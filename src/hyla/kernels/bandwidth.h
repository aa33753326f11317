#pragma once
// The memory reference that decode-speed figures are reported against (BENCHMARKS.md), next to
// matmul.h's GEMM peak: what this machine streams from memory right now, in this process.
#include <cstddef>
#include <cstdint>
#include <memory>
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

// The least time a decoded token's reads take here and now: the plain read loop above over
// buffers laid out like the token's bytes, in the token's order. Which cache serves what is not
// guessed from cache sizes (on a VM the last-level cache that sysfs names is shared with other
// guests, and a buffer of half its size read at DRAM speed here): the reads find out.
//
// A token reads `reread` bytes that every token reads again (the weights every token uses, the
// sequence's state), in one slice per MoE layer, and after each slice that layer's `picked` of
// its `experts` routed experts of `expert_bytes` each, a different random few every token, from
// a pool of all of them. Every OpenMP thread reads its share of each buffer with no barrier
// between them (decode's products synchronise, so this is a bound, not an estimate).
struct TokenReadTime {
  double seconds = 0;  // per token
  // How the time divides between the two kinds of bytes (thread 0's clock over the same pass).
  double reread_seconds = 0, routed_seconds = 0;
  // The bytes read per token: the kinds' sizes, each slice and expert cut to whole 256-byte steps
  // of the loop (at least one).
  int64_t reread_bytes = 0, routed_bytes = 0;
};

class TokenReadBench {
 public:
  // Allocates and touches max_reread bytes and a pool of experts: every layer's, or as many
  // whole layers' as fit in 1 GiB (the layers beyond read the pool's again: DRAM either way).
  TokenReadBench(int64_t max_reread, int64_t moe_layers, int64_t experts, int64_t expert_bytes);
  // Tokens that read `reread` (≤ max_reread) bytes and `picked` (≤ experts) experts per MoE layer.
  TokenReadTime measure(int64_t reread, int64_t picked) const;

 private:
  std::shared_ptr<void> reread_, pool_;
  int64_t max_reread_, moe_layers_, experts_, expert_bytes_, pool_layers_ = 1;
};

}  // namespace hyla
