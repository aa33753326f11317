#pragma once
// Timing helpers shared by the `hyla bench` commands, and the references every figure is reported
// against (measured in the same process).
#include <cstddef>
#include <functional>
#include <span>
#include <vector>

namespace hyla::cli {

// Wall time, or (with use_cpu_clock) the process's CPU time divided by the thread count: on a
// shared machine CPU time is not inflated by other processes taking the cores away.
extern bool use_cpu_clock;
double now_seconds();

// Best time over repetitions (at least `min_reps`, until `min_seconds` have passed): the minimum
// is the least noisy estimate on a shared machine.
double best_seconds(const std::function<void()>& run, int min_reps = 2, double min_seconds = 1.0);

// Streaming read bandwidth of these buffers (best of several passes), GB/s.
double read_bandwidth_gbs(const std::vector<std::span<const std::byte>>& buffers);
// The same over a fresh 512 MB buffer.
double read_bandwidth_gbs();

}  // namespace hyla::cli
