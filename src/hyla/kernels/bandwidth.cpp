#include "hyla/kernels/bandwidth.h"

#include <algorithm>
#include <chrono>

#include "hyla/core/memory.h"
#include "hyla/kernels/vec.h"

namespace hyla {

double measure_read_bandwidth_gbs(const std::vector<std::span<const std::byte>>& buffers) {
  constexpr int64_t kGroup = 4 * vec::kLanes;
  constexpr int kMinPasses = 5;
  constexpr double kMinSeconds = 0.5;
  double bytes = 0;
  for (const auto& b : buffers) bytes += double(int64_t(b.size() / 4) / kGroup * kGroup * 4);
  float sink = 0;
  const auto pass = [&] {
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
  };
  pass();
  double best = 1e30, spent = 0;
  for (int p = 0; p < kMinPasses || (spent < kMinSeconds && p < 50); ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s), spent += s;
  }
  // The sum is never used; this keeps the compiler from dropping the loads.
  volatile float keep = sink;
  (void)keep;
  return bytes / best * 1e-9;
}

double measure_read_bandwidth_gbs() {
  const int64_t n = int64_t(1) << 27;
  const auto memory = allocate_aligned(size_t(n) * sizeof(float));
  float* x = static_cast<float*>(memory.get());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  return measure_read_bandwidth_gbs({std::span<const std::byte>(static_cast<const std::byte*>(memory.get()), size_t(n) * 4)});
}

}  // namespace hyla
