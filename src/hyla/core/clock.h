#pragma once
// Wall time for the timings layers and the trainer report.
#include <chrono>

namespace hyla {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace hyla
