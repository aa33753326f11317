#include "hyla/kernels/residual.h"

#include "hyla/core/team.h"

namespace hyla {

void add_rows(const float* x, const float* base, int64_t rows, int64_t cols, float* y) {
  parallel_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] + (base ? base[r * cols + j] : 0.0f);
  });
}

void accumulate_rows(const float* x, int64_t rows, int64_t cols, float* y) {
  parallel_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < cols; ++j) y[r * cols + j] += x[r * cols + j];
  });
}

}  // namespace hyla
