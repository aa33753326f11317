#include "hyla/kernels/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

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

double measure_read_bandwidth_gbs(size_t bytes) {
  const int64_t n = int64_t(bytes / sizeof(float));
  const auto memory = allocate_aligned(size_t(n) * sizeof(float));
  float* x = static_cast<float*>(memory.get());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  return measure_read_bandwidth_gbs({std::span<const std::byte>(static_cast<const std::byte*>(memory.get()), size_t(n) * 4)});
}

int64_t last_level_cache_bytes() {
  int best_level = 0;
  int64_t bytes = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size"), type_file(dir + "type");
    int level = 0;
    std::string size, type;
    if (!(level_file >> level) || !(size_file >> size) || !(type_file >> type)) break;
    if (type == "Instruction" || level < best_level || size.empty()) continue;
    char* end = nullptr;
    const int64_t value = std::strtoll(size.c_str(), &end, 10);
    const int64_t unit = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : 1;
    best_level = level, bytes = value * unit;
  }
  return bytes;
}

}  // namespace hyla
