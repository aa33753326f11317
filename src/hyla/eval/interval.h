#pragma once
// Confidence intervals for the accuracies evaluations report: never a bare percentage.
#include <cstdint>

namespace hyla {

struct Interval {
  double low = 0, high = 1;
};

// Wilson score interval for `successes` of `n` trials (z = 1.96: 95%); [0, 1] when n is 0.
Interval wilson_interval(int64_t successes, int64_t n, double z = 1.959964);

}  // namespace hyla
