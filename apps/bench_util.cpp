#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <ctime>

#include "hyla/core/threads.h"

namespace hyla::cli {

bool use_cpu_clock = false;

double now_seconds() {
  if (use_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9) / num_threads();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double best_seconds(const std::function<void()>& run, int min_reps, double min_seconds) {
  run();  // warm up: first-touch, primitive creation
  double best = 1e30, total = 0;
  for (int rep = 0; rep < min_reps || total < min_seconds; ++rep) {
    const double t0 = now_seconds();
    run();
    const double s = now_seconds() - t0;
    best = std::min(best, s);
    total += s;
    if (rep >= 20) break;
  }
  return best;
}

}  // namespace hyla::cli
