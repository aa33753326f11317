#include "hyla/kernels/norm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "hyla/core/team.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {

void rmsnorm_forward(const float* x, int64_t ld_x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                     int64_t ld_y, float* rstd) {
  parallel_rows(rows, dim, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * ld_x;
      const float inv = 1.0f / std::sqrt(dot(xr, xr, dim) / float(dim) + eps);
      if (rstd) rstd[r] = inv;
      float* yr = y + r * ld_y;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * inv * w[j];
    }
  });
}

void rmsnorm_backward(const float* x, int64_t ld_x, const float* w, const float* rstd, const float* dy, int64_t ld_dy,
                      int64_t rows, int64_t dim, float* dx, int64_t ld_dx, bool accumulate_dx, float* dw,
                      Workspace& workspace) {
  const int threads = omp_get_max_threads();
  Frame frame(workspace.serial());
  float* const partial = frame.take<float>(threads * dim);
  std::fill(partial, partial + threads * dim, 0.0f);
#pragma omp parallel
  {
    float* dw_local = partial + omp_get_thread_num() * dim;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = x + r * ld_x, *dyr = dy + r * ld_dy;
      const float inv = rstd[r];
      // n = x·inv, y = n⊙w: dn = dy⊙w, dx = inv·(dn − n·mean(dn⊙n)).
      const float mean_dn_n = dot3(dyr, w, xr, dim) * inv / float(dim);
      float* dxr = dx + r * ld_dx;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const float n = xr[j] * inv, d = dyr[j];  // read dy before dx is written: they may alias
        dw_local[j] += d * n;
        const float g = inv * (d * w[j] - n * mean_dn_n);
        dxr[j] = accumulate_dx ? dxr[j] + g : g;
      }
    }
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < dim; ++j) dw[j] += partial[t * dim + j];
}

}  // namespace hyla
