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

void layernorm_forward(const float* x, int64_t ld_x, const float* w, const float* b, int64_t rows, int64_t dim,
                       float eps, float* y, int64_t ld_y, float* stats) {
  parallel_rows(rows, 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * ld_x;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < dim; ++j) sum += xr[j];
      const float mean = sum / float(dim);
      float squares = 0.0f;  // of the deviations: two passes keep a large mean from cancelling
#pragma omp simd reduction(+ : squares)
      for (int64_t j = 0; j < dim; ++j) squares += (xr[j] - mean) * (xr[j] - mean);
      const float inv = 1.0f / std::sqrt(squares / float(dim) + eps);
      if (stats) stats[2 * r] = mean, stats[2 * r + 1] = inv;
      float* yr = y + r * ld_y;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - mean) * inv * w[j] + (b ? b[j] : 0.0f);
    }
  });
}

void layernorm_backward(const float* x, int64_t ld_x, const float* w, const float* stats, const float* dy,
                        int64_t ld_dy, int64_t rows, int64_t dim, float* dx, int64_t ld_dx, bool accumulate_dx,
                        float* dw, float* db, Workspace& workspace) {
  const int threads = omp_get_max_threads();
  Frame frame(workspace.serial());
  float* const partial = frame.take<float>(2 * threads * dim);  // per thread: dw, then db
  std::fill(partial, partial + 2 * threads * dim, 0.0f);
#pragma omp parallel
  {
    float* dw_local = partial + 2 * omp_get_thread_num() * dim;
    float* db_local = dw_local + dim;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = x + r * ld_x, *dyr = dy + r * ld_dy;
      const float mean = stats[2 * r], inv = stats[2 * r + 1];
      // n = (x − μ)·inv, y = n⊙w + b: dn = dy⊙w, dx = inv·(dn − mean(dn) − n·mean(dn⊙n)).
      float sum_dn = 0.0f, sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
      for (int64_t j = 0; j < dim; ++j) {
        const float dn = dyr[j] * w[j];
        sum_dn += dn;
        sum_dn_n += dn * (xr[j] - mean) * inv;
      }
      const float mean_dn = sum_dn / float(dim), mean_dn_n = sum_dn_n / float(dim);
      float* dxr = dx + r * ld_dx;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const float n = (xr[j] - mean) * inv, d = dyr[j];  // read dy before dx is written: they may alias
        dw_local[j] += d * n;
        db_local[j] += d;
        const float g = inv * (d * w[j] - mean_dn - n * mean_dn_n);
        dxr[j] = accumulate_dx ? dxr[j] + g : g;
      }
    }
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < dim; ++j) {
      dw[j] += partial[2 * t * dim + j];
      if (db) db[j] += partial[(2 * t + 1) * dim + j];
    }
}

}  // namespace hyla
