#include "hyla/kernels/residual.h"

#include "hyla/core/threads.h"

namespace hyla {

void add_rows(const float* x, const float* base, int64_t rows, int64_t cols, float* y) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * cols))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] + (base ? base[r * cols + j] : 0.0f);
}

void accumulate_rows(const float* x, int64_t rows, int64_t cols, float* y) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows * cols))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) y[r * cols + j] += x[r * cols + j];
}

}  // namespace hyla
