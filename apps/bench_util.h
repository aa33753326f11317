#pragma once
// Timing helpers shared by the `hyla bench` commands.
#include <functional>

namespace hyla::cli {

// Wall time, or (with use_cpu_clock) the process's CPU time divided by the thread count: on a
// shared machine CPU time is not inflated by other processes taking the cores away.
extern bool use_cpu_clock;
double now_seconds();

// Best time over repetitions (at least `min_reps`, until `min_seconds` have passed): the minimum
// is the least noisy estimate on a shared machine.
double best_seconds(const std::function<void()>& run, int min_reps = 2, double min_seconds = 1.0);

}  // namespace hyla::cli
