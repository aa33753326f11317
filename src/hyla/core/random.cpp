#include "hyla/core/random.h"

#include <bit>
#include <cmath>

namespace hyla {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hash_string(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return h;
}

Rng::Rng(uint64_t seed) {
  for (auto& word : s_) word = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = std::rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next() >> 11) * 0x1p-53; }

double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

uint64_t Rng::below(uint64_t n) {
  if (n <= 1) return 0;
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next();
  while (x >= limit);
  return x % n;
}

size_t Rng::pick(std::span<const double> cumulative_weights) {
  const double u = uniform() * cumulative_weights.back();
  size_t i = 0;
  while (i + 1 < cumulative_weights.size() && u >= cumulative_weights[i]) ++i;
  return i;
}

double Rng::normal() {
  if (cached_normal_bits_) {
    const double z = std::bit_cast<double>(cached_normal_bits_);
    cached_normal_bits_ = 0;
    return z;
  }
  double u1;
  do u1 = uniform();
  while (u1 <= 0.0);
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * M_PI * u2;
  const double second = r * std::sin(theta);
  cached_normal_bits_ = second == 0.0 ? 0 : std::bit_cast<uint64_t>(second);
  return r * std::cos(theta);
}

std::array<uint64_t, 5> Rng::state() const { return {s_[0], s_[1], s_[2], s_[3], cached_normal_bits_}; }

void Rng::set_state(const std::array<uint64_t, 5>& s) {
  for (int i = 0; i < 4; ++i) s_[i] = s[i];
  cached_normal_bits_ = s[4];
}

}  // namespace hyla
