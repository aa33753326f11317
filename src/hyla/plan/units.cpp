#include "hyla/plan/units.h"

#include <fmt/format.h>

#include <cmath>

namespace hyla {

std::string grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

namespace {

// `value` scaled by 1000^k into [1, 1000) with three significant digits, and k (capped at the
// last prefix).
std::string scaled(double value, const char* const* prefixes, int count) {
  int k = 0;
  while (k + 1 < count && std::fabs(value) >= 999.5) value /= 1000, ++k;
  const double magnitude = std::fabs(value);
  const std::string digits = magnitude >= 99.95   ? fmt::format("{:.0f}", value)
                             : magnitude >= 9.995 ? fmt::format("{:.1f}", value)
                                                  : fmt::format("{:.2f}", value);
  return digits + prefixes[k];
}

}  // namespace

std::string si(double value, const std::string& unit) {
  static const char* const kPrefixes[] = {" ", " k", " M", " G", " T", " P", " E"};
  return scaled(value, kPrefixes, 7) + unit;
}

std::string short_count(double n) {
  static const char* const kSuffixes[] = {"", "K", "M", "B", "T"};
  return scaled(n, kSuffixes, 5);
}

std::string duration(double seconds) {
  static const char* const kUnits[] = {" ns", " us", " ms", " s"};
  return scaled(seconds * 1e9, kUnits, 4);
}

}  // namespace hyla
