#include "hyla/eval/next_token_input.h"

#include <algorithm>
#include <vector>

namespace hyla {

ModelInput next_token_input(const TokenWindows& w) {
  ModelInput in;
  std::vector<int64_t> lengths;
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(w.lengths[size_t(r)], w.width) - 1);
    if (n == 0) continue;
    lengths.push_back(n);
    for (int64_t t = 0; t < n; ++t) {
      in.ids.push_back(w.tokens[size_t(r * w.width + t)]);
      in.targets.push_back(w.tokens[size_t(r * w.width + t + 1)]);
    }
  }
  in.tokens = TokenBatch::packed(lengths);
  return in;
}

}  // namespace hyla
