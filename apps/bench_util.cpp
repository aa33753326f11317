#include "bench_util.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#include "hyla/core/tensor.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/vec.h"

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


// Vector loads into independent accumulators (a plain float sum is limited by its add latency,
// not by memory); each buffer's bytes are read as floats, a tail under 256 bytes is skipped.
double read_bandwidth_gbs(const std::vector<std::span<const std::byte>>& buffers) {
  constexpr int64_t kGroup = 4 * vec::kLanes;
  double bytes = 0;
  for (const auto& b : buffers) bytes += double(int64_t(b.size() / 4) / kGroup * kGroup * 4);
  float sink = 0;
  const double s = best_seconds([&] {
    float total = 0;
    for (const auto& b : buffers) {
      const float* x = reinterpret_cast<const float*>(b.data());
      const int64_t n = int64_t(b.size() / 4) / kGroup * kGroup;
#pragma omp parallel reduction(+ : total)
      {
        vec::Vec acc[4] = {vec::zero(), vec::zero(), vec::zero(), vec::zero()};
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i += kGroup)
          vec::unroll<4>([&](auto j) { acc[j] = acc[j] + vec::load(x + i + j * vec::kLanes); });
        total += vec::sum(acc[0] + acc[1] + acc[2] + acc[3]);
      }
    }
    sink += total;
  }, 3, 0.5);
  if (sink == 0.5f) fmt::print("");  // keep the sum alive
  return bytes / s * 1e-9;
}

double read_bandwidth_gbs() {
  const int64_t n = int64_t(1) << 27;
  Tensor buffer = Tensor::empty(DType::F32, {n});
  float* x = buffer.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  return read_bandwidth_gbs({std::span<const std::byte>(static_cast<const std::byte*>(buffer.raw()), buffer.nbytes())});
}

}  // namespace hyla::cli
