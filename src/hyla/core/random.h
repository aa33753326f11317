#pragma once
// A small, fast, portable RNG (xoshiro256**, seeded by SplitMix64) whose state can be saved and
// restored exactly, with its own uniform and normal draws so results match across platforms
// (std::normal_distribution is implementation-defined).
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace hyla {

uint64_t splitmix64(uint64_t& state);
// A stable 64-bit hash of a string (FNV-1a), for deriving per-name seeds.
uint64_t hash_string(std::string_view s);

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next();
  double uniform();                             // [0, 1)
  double uniform(double lo, double hi);         // [lo, hi)
  uint64_t below(uint64_t n);                   // [0, n), unbiased
  // An index drawn in proportion to weights given as their running sums (non-empty, increasing).
  size_t pick(std::span<const double> cumulative_weights);
  double normal();                              // N(0, 1)
  std::array<uint64_t, 5> state() const;        // includes the cached normal draw
  void set_state(const std::array<uint64_t, 5>& s);

 private:
  std::array<uint64_t, 4> s_{};
  uint64_t cached_normal_bits_ = 0;  // bit pattern of a cached normal draw; 0 = none
};

}  // namespace hyla
