#pragma once
// Inputs for the benchmark programs: seeded normal values, the same on every run.
#include <cstdint>
#include <random>
#include <vector>

namespace hyla::bench {

inline std::vector<float> random_vector(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace hyla::bench
