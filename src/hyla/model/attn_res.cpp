#include "hyla/model/attn_res.h"

#include <omp.h>

#include <cmath>

#include "hyla/core/team.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {

AttnRes::AttnRes(ParamStore& store, const std::string& query_name, const std::string& norm_name, int64_t dim, float eps)
    : query_(&store.add(query_name, {dim}, Init::Zeros, Component::AttnRes, /*weight_decay=*/false)),
      norm_(&store.add(norm_name + ".weight", {dim}, Init::Ones, Component::AttnRes, /*weight_decay=*/false)),
      dim_(dim),
      eps_(eps) {}

void AttnRes::forward(const std::vector<const float*>& sources, int64_t rows, float* out, bool save) {
  const int64_t n = int64_t(sources.size()), d = dim_;
  if (!weights_.defined() || weights_.numel() < rows * n) weights_ = Tensor::empty(DType::F32, {std::max<int64_t>(rows * n, 1)});
  std::vector<float>& c = weighted_query_;  // w ⊙ γ: z_n = rstd(V_n) · (V_n · c)
  c.resize(size_t(d));
  for (int64_t j = 0; j < d; ++j) c[size_t(j)] = query_->v()[j] * norm_->v()[j];
  float* weights = weights_.data<float>();
  parallel_rows(rows, n * d, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* p = weights + r * n;
      float top = -INFINITY;
      for (int64_t s = 0; s < n; ++s) {
        const float* v = sources[size_t(s)] + r * d;
        const float rstd = 1.0f / std::sqrt(dot(v, v, d) / float(d) + eps_);
        p[s] = rstd * dot(v, c.data(), d);
        top = std::max(top, p[s]);
      }
      float sum = 0.0f;
      for (int64_t s = 0; s < n; ++s) sum += p[s] = std::exp(p[s] - top);
      float* o = out + r * d;
      std::fill(o, o + d, 0.0f);
      for (int64_t s = 0; s < n; ++s) {
        p[s] /= sum;
        const float* v = sources[size_t(s)] + r * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) o[j] += p[s] * v[j];
      }
    }
  });
  if (save) sources_ = sources, rows_ = rows;
}

void AttnRes::backward(const float* d_out, const std::vector<float*>& source_grads) {
  const int64_t n = int64_t(sources_.size()), d = dim_, rows = rows_;
  HYLA_ASSERT(int64_t(source_grads.size()) == n);
  std::vector<float> c(static_cast<size_t>(d));
  const float* w = query_->v();
  const float* gamma = norm_->v();
  for (int64_t j = 0; j < d; ++j) c[size_t(j)] = w[j] * gamma[j];
  const int threads = omp_get_max_threads();
  std::vector<float> partial(size_t(threads) * size_t(d), 0.0f);  // Σ dz_n · rstd_n · V_n
  const float* weights = weights_.data<float>();
#pragma omp parallel
  {
    float* acc = partial.data() + size_t(omp_get_thread_num()) * size_t(d);
    std::vector<float> dp(static_cast<size_t>(n)), rstd(static_cast<size_t>(n)), z(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* p = weights + r * n;
      const float* g = d_out + r * d;
      float mean_dp = 0.0f;
      for (int64_t s = 0; s < n; ++s) {
        const float* v = sources_[size_t(s)] + r * d;
        dp[size_t(s)] = dot(g, v, d);
        mean_dp += p[s] * dp[size_t(s)];
        rstd[size_t(s)] = 1.0f / std::sqrt(dot(v, v, d) / float(d) + eps_);
        z[size_t(s)] = rstd[size_t(s)] * dot(v, c.data(), d);
      }
      for (int64_t s = 0; s < n; ++s) {
        const float* v = sources_[size_t(s)] + r * d;
        const float dz = p[s] * (dp[size_t(s)] - mean_dp), rs = rstd[size_t(s)];
        // z = rstd·(V·c): ∂z/∂V = rstd·c − z·rstd²·V/d.
        const float k = z[size_t(s)] * rs * rs / float(d);
        float* dv = source_grads[size_t(s)] + r * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) {
          dv[j] += p[s] * g[j] + dz * (rs * c[size_t(j)] - k * v[j]);
          acc[j] += dz * rs * v[j];
        }
      }
    }
  }
  float* dw = query_->g();
  float* dgamma = norm_->g();
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < d; ++j) {
      const float a = partial[size_t(t) * size_t(d) + size_t(j)];
      dw[j] += a * gamma[j];
      dgamma[j] += a * w[j];
    }
}

}  // namespace hyla
