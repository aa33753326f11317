#include "hyla/model/collective.h"

#include <algorithm>

namespace hyla {

void SingleProcess::start_reduce_scatter(std::span<const float> values, std::span<const int>, float* mine) {
  std::copy(values.begin(), values.end(), mine);
}

SingleProcess& single_process() {
  static SingleProcess one;
  return one;
}

}  // namespace hyla
