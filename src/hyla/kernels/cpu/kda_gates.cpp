#include "hyla/kernels/kda_gates.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/team.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {
namespace {

constexpr float kL2Eps = 1e-6f;  // SPEC §3: x / sqrt(Σx² + 1e-6)

// out[c] += Σ_r x[r, c] for an rows × cols block (row stride ld). Threads own 16-column blocks, so
// each sum runs over the rows in order whatever the thread count.
void add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < cols; c0 += 16) {
    const int64_t c1 = std::min(cols, c0 + 16);
    float acc[16] = {0};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += x[r * ld + c];
    for (int64_t c = c0; c < c1; ++c) out[c] += acc[c - c0];
  }
}

// Calls f(j, mask) for each vector of [begin, end), the last one masked.
template <typename F>
void for_each_vector(int64_t begin, int64_t end, F&& f) {
  int64_t j = begin;
  for (; j + vec::kLanes <= end; j += vec::kLanes) f(j, vec::kAll);
  if (j < end) f(j, vec::lane_range(0, end - j));
}

}  // namespace

void kda_prepare_forward(const KdaPrepareShape& s, const KdaDecayGate& gate, const KdaPrepareInputs& in,
                         const KdaPrepared& out) {
  const int64_t N = s.rows, H = s.heads, K = s.head_dim, HK = H * K, ld = s.ld_proj;
  const float q_scale = 1.0f / std::sqrt(float(K));
  float* const planes[3] = {out.q, out.k, out.v};
  parallel_rows(N, 3 * HK, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* c = in.conv + r * 3 * HK;
      for (int which = 0; which < 3; ++which) {
        float* x = planes[which] + r * HK;
        std::copy(c + which * HK, c + (which + 1) * HK, x);
        silu_inplace(x, HK);
      }
      for (int64_t h = 0; h < H; ++h)
        for (int which = 0; which < 2; ++which) {  // q then k
          float* head = planes[which] + r * HK + h * K;
          const float inv = 1.0f / std::sqrt(dot(head, head, K) + kL2Eps);
          out.inv_norm[r * 2 * H + which * H + h] = inv;
          const float scale = inv * (which == 0 ? q_scale : 1.0f);
          for (int64_t j = 0; j < K; ++j) head[j] *= scale;
        }
      const float* z_in = in.f + r * ld;
      float* g = out.g + r * HK;
      for (int64_t h = 0; h < H; ++h) {
        const float a = std::exp(gate.a_log[h]);
        if (gate.lower_bounded) {
          for_each_vector(h * K, (h + 1) * K, [&](int64_t j, vec::Mask m) {
            const vec::Vec z = vec::load(z_in + j, m) + vec::load(gate.dt_bias + j, m);
            vec::store(g + j, vec::broadcast(gate.lower_bound) * sigmoid(vec::broadcast(a) * z), m);
          });
        } else {
          for (int64_t j = h * K; j < (h + 1) * K; ++j) g[j] = -a * softplus(z_in[j] + gate.dt_bias[j]);
        }
      }
      const float* b_in = in.b + r * ld;
      for (int64_t h = 0; h < H; ++h) out.beta[r * H + h] = sigmoid(b_in[h]);
    }
  });
}

void kda_prepare_backward(const KdaPrepareShape& s, const KdaDecayGate& gate, const KdaPrepareInputs& in,
                          const KdaPrepared& saved, const KdaPrepareGrads& grads, const KdaPrepareInputGrads& out) {
  const int64_t N = s.rows, H = s.heads, K = s.head_dim, HK = H * K, ld = s.ld_proj;
  const float q_scale = 1.0f / std::sqrt(float(K));
  const float* const planes[3] = {saved.q, saved.k, saved.v};
  const float* const d_planes[3] = {grads.dq, grads.dk, grads.dv};
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    // β = σ(b).
    for (int64_t h = 0; h < H; ++h) {
      const float b = saved.beta[r * H + h];
      out.db[r * ld + h] = grads.dbeta[r * H + h] * b * (1.0f - b);
    }
    // g = lb·σ(a z) or -a·softplus(z), z = f + dt_bias: dz is df; dA_log is summed below.
    const float* z_in = in.f + r * ld;
    float* df = out.df + r * ld;
    for (int64_t h = 0; h < H; ++h) {
      const float a = std::exp(gate.a_log[h]);
      for (int64_t j = h * K; j < (h + 1) * K; ++j) {
        const float z = z_in[j] + gate.dt_bias[j], d = grads.dg[r * HK + j];
        if (gate.lower_bounded) {
          const float sg = sigmoid(a * z);
          df[j] = d * gate.lower_bound * sg * (1.0f - sg) * a;
        } else {
          df[j] = -d * a * sigmoid(z);
        }
      }
    }
    // q, k: x ↦ x / sqrt(Σx² + eps) (· K^-1/2 for q), after silu; v: silu. Back to the conv outputs.
    const float* c = in.conv + r * 3 * HK;
    for (int which = 0; which < 3; ++which) {
      const float* d = d_planes[which] + r * HK;
      float* dc = out.d_conv + r * ld + which * HK;
      if (which < 2) {  // dc holds d(silu output) until the silu step below
        const float scale = which == 0 ? q_scale : 1.0f;
        for (int64_t h = 0; h < H; ++h) {
          const float inv = saved.inv_norm[r * 2 * H + which * H + h];
          const float* y = planes[which] + r * HK + h * K;  // = n · scale, n the unit vector
          const float* dh = d + h * K;
          float* dx = dc + h * K;
          // n = x·inv, dn = scale·dy: dx = inv·(dn − n (n·dn)).
          const float ndn = dot(y, dh, K);  // n·dn = (y/scale)·(dh·scale)
          for (int64_t j = 0; j < K; ++j) {
            const float n = y[j] / scale;
            dx[j] = inv * (dh[j] * scale - n * ndn);
          }
        }
      }
      const float* d_silu = which < 2 ? dc : d;
      for (int64_t j = 0; j < HK; ++j) {
        const float x = c[which * HK + j], sg = sigmoid(x);
        dc[j] = d_silu[j] * sg * (1.0f + x * (1.0f - sg));  // d silu / dx
      }
    }
  }
  // dt_bias: Σ_rows dz; A_log[h]: Σ dz·z (bounded: ∂g/∂A_log = z ∂g/∂z) or Σ dg·g (softplus: ∂g/∂A_log = g).
  add_column_sums(out.df, N, HK, ld, out.d_dt_bias);
  for (int64_t h = 0; h < H; ++h) {
    double sum = 0.0;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = h * K; j < (h + 1) * K; ++j)
        sum += gate.lower_bounded ? out.df[r * ld + j] * (in.f[r * ld + j] + gate.dt_bias[j])
                                  : grads.dg[r * HK + j] * saved.g[r * HK + j];
    out.d_a_log[h] += float(sum);
  }
}

void kda_output_gate_forward(const float* normed, const float* logits, int64_t ld_logits, int64_t rows,
                             int64_t width, float* gated) {
  parallel_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = logits + r * ld_logits;
      const float* n = normed + r * width;
      float* out = gated + r * width;
      for_each_vector(0, width, [&](int64_t j, vec::Mask m) {
        vec::store(out + j, vec::load(n + j, m) * sigmoid(vec::load(gate + j, m)), m);
      });
    }
  });
}

void kda_output_gate_backward(const float* normed, const float* logits, int64_t ld_logits, int64_t rows,
                              int64_t width, const float* d_gated, float* d_normed, float* d_logits) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = logits + r * ld_logits;
    const float* n = normed + r * width;
    const float* dy = d_gated + r * width;
    float* dn = d_normed + r * width;
    float* dgate = d_logits + r * ld_logits;
    for (int64_t j = 0; j < width; ++j) {
      const float s = sigmoid(gate[j]);
      dgate[j] = dy[j] * n[j] * s * (1.0f - s);
      dn[j] = dy[j] * s;
    }
  }
}

}  // namespace hyla
