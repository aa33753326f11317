#include "hyla/kernels/attn_res.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "hyla/core/team.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {

void attn_res_forward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                      const float* norm_weight, float eps, float* weights, float* out, Workspace& workspace) {
  const int64_t n = count, d = dim;
  Frame frame(workspace.serial());
  float* c = frame.take<float>(d);  // w ⊙ γ: z_n = rstd(V_n) · (V_n · c)
  for (int64_t j = 0; j < d; ++j) c[j] = query[j] * norm_weight[j];
  parallel_rows(rows, n * d, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* p = weights + r * n;
      float top = -INFINITY;
      for (int64_t s = 0; s < n; ++s) {
        const float* v = sources[s] + r * d;
        const float rstd = 1.0f / std::sqrt(dot(v, v, d) / float(d) + eps);
        p[s] = rstd * dot(v, c, d);
        top = std::max(top, p[s]);
      }
      float sum = 0.0f;
      for (int64_t s = 0; s < n; ++s) sum += p[s] = std::exp(p[s] - top);
      float* o = out + r * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t s = 0; s < n; ++s) {
        p[s] /= sum;
        const float* v = sources[s] + r * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) o[j] += p[s] * v[j];
      }
    }
  });
}

void attn_res_backward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                       const float* norm_weight, float eps, const float* weights, const float* d_out,
                       float* const* source_grads, float* d_query, float* d_norm_weight, Workspace& workspace) {
  const int64_t n = count, d = dim;
  const float* w = query;
  const float* gamma = norm_weight;
  const int threads = omp_get_max_threads();
  Frame frame(workspace.serial());
  float* c = frame.take<float>(d);
  for (int64_t j = 0; j < d; ++j) c[j] = w[j] * gamma[j];
  float* partial = frame.take<float>(threads * d);  // Σ dz_n · rstd_n · V_n
  std::fill(partial, partial + threads * d, 0.0f);
  float* per_source = frame.take<float>(threads * 3 * n);  // dp, rstd and z of a thread's row
#pragma omp parallel
  {
    float* acc = partial + omp_get_thread_num() * d;
    float* dp = per_source + omp_get_thread_num() * 3 * n;
    float* rstd = dp + n;
    float* z = rstd + n;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = weights + r * n;
      const float* g = d_out + r * d;
      float mean_dp = 0.0f;
      for (int64_t s = 0; s < n; ++s) {
        const float* v = sources[s] + r * d;
        dp[s] = dot(g, v, d);
        mean_dp += p[s] * dp[s];
        rstd[s] = 1.0f / std::sqrt(dot(v, v, d) / float(d) + eps);
        z[s] = rstd[s] * dot(v, c, d);
      }
      for (int64_t s = 0; s < n; ++s) {
        const float* v = sources[s] + r * d;
        const float dz = p[s] * (dp[s] - mean_dp), rs = rstd[s];
        // z = rstd·(V·c): ∂z/∂V = rstd·c − z·rstd²·V/d.
        const float k = z[s] * rs * rs / float(d);
        float* dv = source_grads[s] + r * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          dv[j] += p[s] * g[j] + dz * (rs * c[j] - k * v[j]);
          acc[j] += dz * rs * v[j];
        }
      }
    }
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < d; ++j) {
      const float a = partial[t * d + j];
      d_query[j] += a * gamma[j];
      d_norm_weight[j] += a * w[j];
    }
}

}  // namespace hyla
