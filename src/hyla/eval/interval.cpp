#include "hyla/eval/interval.h"

#include <algorithm>
#include <cmath>

namespace hyla {

Interval wilson_interval(int64_t successes, int64_t n, double z) {
  if (n <= 0) return {};
  const double p = double(successes) / double(n), z2 = z * z, nn = double(n);
  const double centre = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = z / (1 + z2 / nn) * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

}  // namespace hyla
