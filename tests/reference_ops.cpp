#include "reference_ops.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>

#include "hyla/core/error.h"

namespace hyla::reference {
namespace {

std::vector<double> widen(const float* x, int64_t n) {
  return n > 0 ? std::vector<double>(x, x + n) : std::vector<double>{};
}

void narrow(const std::vector<double>& x, float* out) {
  for (size_t i = 0; i < x.size(); ++i) out[i] = float(x[i]);
}

// Elements a block of `rows` rows of `width` values, `ld` apart, spans.
int64_t extent(int64_t rows, int64_t width, int64_t ld) { return rows > 0 ? (rows - 1) * ld + width : 0; }

// A rows × cols block of x (row stride ld) rounded to bf16, rows packed cols apart.
std::vector<bf16> rounded(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<bf16> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols + c)] = to_bf16(x[r * ld + c]);
  return out;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

bool visible(int64_t key, int64_t pos, int64_t window) { return key <= pos && (window == 0 || pos - key < window); }
bool visible(int64_t key, int64_t pos, const AttentionDims& d) { return !d.causal || visible(key, pos, d.window); }

// Per source of row r of an AttnRes mixture: rstd(V_n[r]) and z_n = rstd · (V_n[r] · (w ⊙ γ)).
struct AttnResScores {
  std::vector<double> rstd, z;
};

AttnResScores attn_res_scores(const float* const* sources, int64_t count, int64_t r, int64_t dim, const float* query,
                              const float* norm_weight, float eps) {
  AttnResScores scores{std::vector<double>(size_t(count)), std::vector<double>(size_t(count))};
  for (int64_t s = 0; s < count; ++s) {
    const float* v = sources[s] + r * dim;
    double squares = 0, weighted = 0;
    for (int64_t j = 0; j < dim; ++j) {
      squares += double(v[j]) * v[j];
      weighted += double(v[j]) * query[j] * norm_weight[j];
    }
    scores.rstd[size_t(s)] = 1.0 / std::sqrt(squares / double(dim) + eps);
    scores.z[size_t(s)] = scores.rstd[size_t(s)] * weighted;
  }
  return scores;
}

}  // namespace

void small_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  reference::gemm(trans_a ? Trans::T : Trans::N, Trans::N, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void small_gemm_bf16(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc, void*) {
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const std::vector<bf16> a = rounded(A, a_rows, a_cols, lda), b = rounded(B, K, N, ldb);
  reference::gemm(trans_a ? Trans::T : Trans::N, Trans::N, M, N, K, alpha, a.data(), a_cols, b.data(), N, beta, C,
                  ldc);
}

void rmsnorm_forward(const float* x, int64_t ld_x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                     int64_t ld_y, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld_x;
    double squares = 0;
    for (int64_t j = 0; j < dim; ++j) squares += double(xr[j]) * xr[j];
    const double inv = 1.0 / std::sqrt(squares / double(dim) + eps);
    if (rstd) rstd[r] = float(inv);
    for (int64_t j = 0; j < dim; ++j) y[r * ld_y + j] = float(xr[j] * inv * w[j]);
  }
}

void layernorm_forward(const float* x, int64_t ld_x, const float* w, const float* b, int64_t rows, int64_t dim,
                       float eps, float* y, int64_t ld_y, float* stats) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ld_x;
    double sum = 0, squares = 0;
    for (int64_t j = 0; j < dim; ++j) sum += xr[j];
    const double mean = sum / double(dim);
    for (int64_t j = 0; j < dim; ++j) squares += (xr[j] - mean) * (xr[j] - mean);
    const double inv = 1.0 / std::sqrt(squares / double(dim) + eps);
    if (stats) stats[2 * r] = float(mean), stats[2 * r + 1] = float(inv);
    for (int64_t j = 0; j < dim; ++j) y[r * ld_y + j] = float((xr[j] - mean) * inv * w[j] + (b ? b[j] : 0.0));
  }
}

void gelu_forward(Gelu kind, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = float(kind == Gelu::Erf
                     ? 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))
                     : 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
  }
}

void gated_activation_forward(GatedActivation act, const float* gu, int64_t rows, int64_t width, float* h) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) {
      const double a = gu[r * 2 * width + j], b = gu[r * 2 * width + width + j];
      const double beta = act.situ_beta, lambda = act.situ_linear_beta;
      const double limit = act.swiglu_limit;
      const double gated = act.kind == GatedActivation::Kind::Swiglu && limit > 0
                               ? std::min(a * sigmoid(a), limit) * std::clamp(b, -limit, limit)
                           : act.kind == GatedActivation::Kind::Swiglu
                               ? a * sigmoid(a) * b
                               : beta * std::tanh(a / beta) * sigmoid(a) * (lambda > 0 ? lambda * std::tanh(b / lambda) : b);
      h[r * width + j] = float(gated);
    }
}

void sigmoid_rows(float* x, int64_t rows, int64_t width, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) x[r * ld + j] = float(sigmoid(x[r * ld + j]));
}

void sigmoid_rows_backward(const float* s, int64_t ld_s, int64_t rows, int64_t width, float* d, int64_t ld_d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) {
      const double sj = s[r * ld_s + j];
      d[r * ld_d + j] = float(double(d[r * ld_d + j]) * sj * (1.0 - sj));
    }
}

void sigmoid_gate_forward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                          float* y) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) y[r * width + j] = float(double(x[r * width + j]) * s[r * ld_s + j / group]);
}

void sigmoid_gate_backward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                           float* dy, float* d_logit, int64_t ld_logit) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < width / group; ++g0) {
      const double g = s[r * ld_s + g0];
      double sum = 0;
      for (int64_t j = g0 * group; j < (g0 + 1) * group; ++j) {
        const double d = dy[r * width + j];
        sum += d * x[r * width + j];
        dy[r * width + j] = float(d * g);
      }
      d_logit[r * ld_logit + g0] = float(sum * g * (1.0 - g));
    }
}

void rope_table(const int64_t* positions, int64_t rows, int64_t dim, double theta, float* table) {
  const int64_t pairs = dim / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < pairs; ++i) {
      const double angle = double(positions[r]) * std::pow(theta, -2.0 * double(i) / double(dim));
      table[r * dim + i] = float(std::cos(angle));
      table[r * dim + pairs + i] = float(std::sin(angle));
    }
}

void rope_table_2d(const int64_t* rows, const int64_t* columns, int64_t n, int64_t dim, double theta, float* table) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < dim / 4; ++i) {
      const double frequency = std::pow(theta, -4.0 * double(i) / double(dim));
      for (int64_t axis = 0; axis < 2; ++axis) {
        const double angle = double(axis == 0 ? columns[r] : rows[r]) * frequency;
        table[r * dim + 2 * i + axis] = float(std::cos(angle));
        table[r * dim + dim / 2 + 2 * i + axis] = float(std::sin(angle));
      }
    }
}

void rope_forward(const float* table, int64_t rows, int64_t heads, int64_t dim, const float* x, HeadLayout x_layout,
                  float* y, HeadLayout y_layout) {
  const int64_t pairs = dim / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < pairs; ++i) {
        const float* in = x + r * x_layout.row_stride + h * x_layout.head_stride + 2 * i;
        float* out = y + r * y_layout.row_stride + h * y_layout.head_stride + 2 * i;
        const double x0 = in[0], x1 = in[1], c = table[r * dim + i], s = table[r * dim + pairs + i];
        out[0] = float(x0 * c - x1 * s);
        out[1] = float(x0 * s + x1 * c);
      }
}

void causal_conv1d_forward(const Conv1dShape& s, const float* x, int64_t ld_x, const float* w,
                           const float* const* tails, float* y, int64_t ld_y, Workspace&) {
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t first = s.starts[b];
    // Input t of sequence b: its row for t >= 0, else entry kernel-1+t of its tail, else 0.
    const auto input = [&](int64_t t, int64_t c) -> double {
      if (t >= 0) return x[(first + t) * ld_x + c];
      if (tails && tails[b]) return tails[b][(s.kernel - 1 + t) * s.channels + c];
      return 0.0;
    };
    for (int64_t t = 0; t < s.starts[b + 1] - first; ++t)
      for (int64_t c = 0; c < s.channels; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < s.kernel; ++j) sum += double(w[c * s.kernel + j]) * input(t - s.kernel + 1 + j, c);
        y[(first + t) * ld_y + c] = float(sum);
      }
  }
}

void add_rows(const float* x, const float* base, int64_t rows, int64_t cols, float* y) {
  for (int64_t i = 0; i < rows * cols; ++i) y[i] = float(double(x[i]) + (base ? double(base[i]) : 0.0));
}

namespace {
float widened(float x) { return x; }
float widened(bf16 x) { return to_f32(x); }
template <typename To>
To stored(float x) {
  if constexpr (std::is_same_v<To, bf16>) return to_bf16(x);
  else return x;
}

template <typename From, typename To>
void copy_heads_as(const From* src, HeadLayout ls, int64_t rows, int64_t heads, int64_t width, To* dst, HeadLayout ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < width; ++i)
        dst[r * ld.row_stride + h * ld.head_stride + i] =
            stored<To>(widened(src[r * ls.row_stride + h * ls.head_stride + i]));
}
}  // namespace

void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout) {
  copy_heads_as(src, src_layout, rows, heads, width, dst, dst_layout);
}
void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, bf16* dst,
                HeadLayout dst_layout) {
  copy_heads_as(src, src_layout, rows, heads, width, dst, dst_layout);
}
void copy_heads(const bf16* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout) {
  copy_heads_as(src, src_layout, rows, heads, width, dst, dst_layout);
}

void sum_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
               int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) {
      double sum = 0;
      for (int64_t h = 0; h < heads; ++h) sum += src[r * src_layout.row_stride + h * src_layout.head_stride + i];
      dst[r * dst_stride + i] = float(sum);
    }
}

void gather_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < width; ++i) out[j * width + i] = x[int64_t(ids[j]) * width + i];
}

void scatter_add_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* y) {
  int64_t rows = 0;  // the rows of y the ids reach
  for (int64_t j = 0; j < n; ++j) rows = std::max<int64_t>(rows, ids[j] + 1);
  std::vector<double> sum(size_t(rows * width), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) sum[size_t(r * width + i)] = y[r * width + i];
  for (int64_t j = 0; j < n; ++j)
    if (ids[j] >= 0)
      for (int64_t i = 0; i < width; ++i) sum[size_t(ids[j] * width + i)] += x[j * width + i];
  narrow(sum, y);
}

void attn_res_forward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                      const float* norm_weight, float eps, float* weights, float* out, Workspace&) {
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> z = attn_res_scores(sources, count, r, dim, query, norm_weight, eps).z;
    const double top = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double x : z) sum += std::exp(x - top);
    for (int64_t j = 0; j < dim; ++j) {
      double o = 0;
      for (int64_t s = 0; s < count; ++s) o += std::exp(z[size_t(s)] - top) / sum * sources[s][r * dim + j];
      out[r * dim + j] = float(o);
    }
    for (int64_t s = 0; s < count; ++s) weights[r * count + s] = float(std::exp(z[size_t(s)] - top) / sum);
  }
}

void attn_res_backward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                       const float* norm_weight, float eps, const float* weights, const float* d_out,
                       float* const* source_grads, float* d_query, float* d_norm_weight, Workspace&) {
  std::vector<double> dc(size_t(dim), 0.0);  // dL/d(w ⊙ γ)
  for (int64_t r = 0; r < rows; ++r) {
    const AttnResScores scores = attn_res_scores(sources, count, r, dim, query, norm_weight, eps);
    const float* p = weights + r * count;
    const float* g = d_out + r * dim;
    // out = Σ p_n V_n: dL/dp_n = g · V_n; through the softmax dz_n = p_n (dL/dp_n − Σ_m p_m dL/dp_m).
    std::vector<double> dp(static_cast<size_t>(count));
    double mean = 0;
    for (int64_t s = 0; s < count; ++s) {
      for (int64_t j = 0; j < dim; ++j) dp[size_t(s)] += double(g[j]) * sources[s][r * dim + j];
      mean += p[s] * dp[size_t(s)];
    }
    for (int64_t s = 0; s < count; ++s) {
      const double dz = p[s] * (dp[size_t(s)] - mean), rstd = scores.rstd[size_t(s)], z = scores.z[size_t(s)];
      const float* v = sources[s] + r * dim;
      float* dv = source_grads[s] + r * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const double c = double(query[j]) * norm_weight[j];
        dv[j] = float(dv[j] + p[s] * double(g[j]) + dz * (rstd * c - z * rstd * rstd * v[j] / double(dim)));
        dc[size_t(j)] += dz * rstd * v[j];
      }
    }
  }
  for (int64_t j = 0; j < dim; ++j) {
    d_query[j] = float(d_query[j] + dc[size_t(j)] * norm_weight[j]);
    d_norm_weight[j] = float(d_norm_weight[j] + dc[size_t(j)] * query[j]);
  }
}

void select_experts(const float* scores, const float* bias, int64_t n, int64_t experts, int64_t k, float scaling,
                    int32_t* selected, float* weights) {
  for (int64_t t = 0; t < n; ++t) {
    const float* s = scores + t * experts;
    std::vector<int32_t> order(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) order[size_t(e)] = int32_t(e);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return double(s[a]) + bias[a] > double(s[b]) + bias[b]; });
    double sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += s[order[size_t(i)]];
    for (int64_t i = 0; i < k; ++i) {
      selected[t * k + i] = order[size_t(i)];
      weights[t * k + i] = float(double(scaling) * s[order[size_t(i)]] / sum);
    }
  }
}

void routing_weights_backward(const float* scores, const int32_t* selected, const float* weights, int64_t n,
                              int64_t experts, int64_t k, float scaling, const float* d_weights, float* d_scores) {
  for (int64_t t = 0; t < n; ++t) {
    // w_i = S s_i / Z, Z = Σ_top-k s: dL/ds_j = S/Z · dL/dw_j − Σ_i dL/dw_i · w_i / Z.
    double z = 0, weighted = 0;
    for (int64_t i = 0; i < k; ++i) {
      z += scores[t * experts + selected[t * k + i]];
      weighted += double(d_weights[t * k + i]) * weights[t * k + i];
    }
    for (int64_t e = 0; e < experts; ++e) d_scores[t * experts + e] = 0.0f;
    for (int64_t i = 0; i < k; ++i)
      d_scores[t * experts + selected[t * k + i]] = float((double(scaling) * d_weights[t * k + i] - weighted) / z);
  }
}

void routed_output_backward(const float* h, const float* routing_weight, int64_t rows, int64_t width, float* dh,
                            float* weighted_h, float* d_weight) {
  for (int64_t j = 0; j < rows; ++j) {
    double dot = 0;
    for (int64_t i = 0; i < width; ++i) dot += double(dh[j * width + i]) * h[j * width + i];
    d_weight[j] = float(dot);
    for (int64_t i = 0; i < width; ++i) {
      dh[j * width + i] = float(double(dh[j * width + i]) * routing_weight[j]);
      weighted_h[j * width + i] = float(double(h[j * width + i]) * routing_weight[j]);
    }
  }
}

void combine_expert_rows(const float* slot_rows, int64_t width, const int32_t* token_slot, const float* slot_weight,
                         int64_t tokens, int64_t k, bool accumulate, float* y) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < width; ++i) {
      double sum = accumulate ? double(y[t * width + i]) : 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = token_slot[t * k + j];
        sum += (slot_weight ? double(slot_weight[slot]) : 1.0) * slot_rows[slot * width + i];
      }
      y[t * width + i] = float(sum);
    }
}

void quantile_margins(const float* scores, const float* bias, const int32_t* selected, int64_t tokens, int64_t experts,
                      int64_t k, float* margins) {
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<bool> chosen(size_t(experts), false);
    for (int64_t i = 0; i < k; ++i) chosen[size_t(selected[t * k + i])] = true;
    double alpha = -INFINITY;
    for (int64_t e = 0; e < experts; ++e)
      if (!chosen[size_t(e)]) alpha = std::max(alpha, double(scores[t * experts + e]) + bias[e]);
    for (int64_t e = 0; e < experts; ++e) margins[t * experts + e] = float(scores[t * experts + e] - alpha);
  }
}

void margin_histograms(const float* margins, int64_t tokens, int64_t experts, float lo, float bin_width, int64_t bins,
                       int64_t* counts) {
  for (int64_t i = 0; i < experts * bins; ++i) counts[i] = 0;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < experts; ++e) {
      const double bin = std::floor((double(margins[t * experts + e]) - lo) / bin_width);
      ++counts[e * bins + int64_t(std::clamp(bin, 0.0, double(bins - 1)))];
    }
}

void kth_largest_per_column(const float* values, int64_t rows, int64_t cols, int64_t rank, float*, float* out) {
  for (int64_t c = 0; c < cols; ++c) {
    std::vector<float> column;
    for (int64_t r = 0; r < rows; ++r) column.push_back(values[r * cols + c]);
    std::sort(column.begin(), column.end(), std::greater<float>());
    out[c] = column[size_t(rank - 1)];
  }
}

double aux_loss_sum(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k) {
  double sum = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    double f_dot_s = 0, z = 0;
    for (int64_t e = 0; e < experts; ++e) {
      f_dot_s += double(load[e]) / double(tokens * k) * scores[t * experts + e];
      z += scores[t * experts + e];
    }
    sum += f_dot_s / z;
  }
  return sum;
}

void aux_loss_sum_backward(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k,
                           float c, float* d_scores) {
  for (int64_t t = 0; t < tokens; ++t) {
    double f_dot_s = 0, z = 0;
    for (int64_t e = 0; e < experts; ++e) {
      f_dot_s += double(load[e]) / double(tokens * k) * scores[t * experts + e];
      z += scores[t * experts + e];
    }
    for (int64_t e = 0; e < experts; ++e) {
      const double f = double(load[e]) / double(tokens * k);
      d_scores[t * experts + e] = float(d_scores[t * experts + e] + double(c) * (f - f_dot_s / z) / z);
    }
  }
}

void quantize_int8_weights(const float* w, int64_t rows, int64_t cols, int64_t block, int8_t* values, float* scales) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / block; ++b) {
      double max_abs = 0;
      for (int64_t i = 0; i < block; ++i) max_abs = std::max(max_abs, std::fabs(double(w[r * cols + b * block + i])));
      const double scale = float(max_abs / 127.0);  // the values are w / the stored f32 scale
      scales[r * (cols / block) + b] = float(scale);
      for (int64_t i = 0; i < block; ++i)
        values[r * cols + b * block + i] =
            scale > 0 ? int8_t(std::clamp(std::nearbyint(w[r * cols + b * block + i] / scale), -127.0, 127.0)) : 0;
    }
}

double cross_entropy_loss(const float* logits, int64_t rows, int64_t classes, const int32_t* targets,
                          const float* weights, float logit_scale) {
  const std::vector<double> x = widen(logits, rows * classes);
  return reference::cross_entropy_loss(x.data(), rows, classes, targets, weights, logit_scale);
}

double cross_entropy_loss(const double* logits, int64_t rows, int64_t classes, const int32_t* targets,
                          const float* weights, float logit_scale) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = targets[r];
    if (t < 0) continue;
    const double* x = logits + r * classes;
    const double s = logit_scale, top = s * *std::max_element(x, x + classes);
    double sum = 0.0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(s * x[j] - top);
    total += (weights ? double(weights[r]) : 1.0) * (top + std::log(sum) - s * x[t]);
  }
  return total;
}

float kda_forward(const KdaShape& shape, const KdaInputs& in, const KdaOptions&, float* o,
                  float* const* final_states, KdaSavedStates* saved, Workspace&) {
  HYLA_CHECK(saved == nullptr, "reference kda_forward: there is no reference backward to save states for");
  const int64_t H = shape.heads, K = shape.key_dim, V = shape.value_dim, N = in.batch ? in.starts[in.batch] : 0;
  const int64_t state = H * K * V;
  KdaDoubleInputs x{widen(in.q, N * H * K), widen(in.k, N * H * K),   widen(in.v, N * H * V),
                    widen(in.g, N * H * K), widen(in.beta, N * H), std::vector<double>(size_t(in.batch * state), 0.0)};
  for (int64_t b = 0; in.initial_states && b < in.batch; ++b)
    std::copy(in.initial_states[b], in.initial_states[b] + state, x.initial_states.begin() + b * state);
  std::vector<double> out, finals;
  reference::kda_recurrence(shape, in.batch, in.starts, x, out, finals);
  narrow(out, o);
  for (int64_t b = 0; final_states && b < in.batch; ++b)
    for (int64_t i = 0; i < state; ++i) final_states[b][i] = float(finals[size_t(b * state + i)]);
  return 0.0f;
}

void kda_recurrence(const KdaShape& shape, int64_t batch, const int64_t* starts, const KdaDoubleInputs& in,
                    std::vector<double>& o, std::vector<double>& final_states) {
  const int64_t H = shape.heads, K = shape.key_dim, V = shape.value_dim;
  const std::vector<double>&q = in.q, &k = in.k, &v = in.v, &g = in.g, &beta = in.beta, &s0 = in.initial_states;
  o.assign(size_t((batch ? starts[batch] : 0) * H * V), 0.0);
  final_states.assign(s0.size(), 0.0);
  std::vector<double> S(static_cast<size_t>(K * V)), e(static_cast<size_t>(V));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::copy(s0.begin() + (b * H + h) * K * V, s0.begin() + (b * H + h + 1) * K * V, S.begin());
      for (int64_t t = starts[b]; t < starts[b + 1]; ++t) {
        const int64_t x = t * H + h;
        for (int64_t c = 0; c < K; ++c)
          for (int64_t j = 0; j < V; ++j) S[c * V + j] *= std::exp(g[x * K + c]);
        for (int64_t j = 0; j < V; ++j) {
          double s = 0;
          for (int64_t c = 0; c < K; ++c) s += S[c * V + j] * k[x * K + c];
          e[j] = v[x * V + j] - s;
        }
        for (int64_t c = 0; c < K; ++c)
          for (int64_t j = 0; j < V; ++j) S[c * V + j] += beta[x] * k[x * K + c] * e[j];
        for (int64_t j = 0; j < V; ++j) {
          double s = 0;
          for (int64_t c = 0; c < K; ++c) s += S[c * V + j] * q[x * K + c];
          o[x * V + j] = s;
        }
      }
      std::copy(S.begin(), S.end(), final_states.begin() + (b * H + h) * K * V);
    }
}

void kda_prepare_forward(const KdaPrepareShape& s, const KdaDecayGate& gate, const KdaPrepareInputs& in,
                         const KdaPrepared& out) {
  const int64_t N = s.rows, H = s.heads, HK = H * s.head_dim;
  const std::vector<double> conv = widen(in.conv, N * 3 * HK), f = widen(in.f, extent(N, HK, s.ld_proj)),
                            b = widen(in.b, extent(N, H, s.ld_proj)), a_log = widen(gate.a_log, H),
                            dt_bias = widen(gate.dt_bias, HK);
  const KdaPreparedDouble r = reference::kda_prepare(s, gate.lower_bounded, gate.lower_bound,
                                          {conv.data(), f.data(), b.data(), a_log.data(), dt_bias.data()});
  narrow(r.q, out.q);
  narrow(r.k, out.k);
  narrow(r.v, out.v);
  narrow(r.inv_norm, out.inv_norm);
  narrow(r.g, out.g);
  narrow(r.beta, out.beta);
}

KdaPreparedDouble kda_prepare(const KdaPrepareShape& s, bool lower_bounded, double lower_bound,
                              const KdaPrepareDoubleInputs& in) {
  const int64_t N = s.rows, H = s.heads, K = s.head_dim, HK = H * K;
  KdaPreparedDouble out;
  std::vector<double>* planes[3] = {&out.q, &out.k, &out.v};
  for (std::vector<double>* p : planes) p->assign(size_t(N * HK), 0.0);
  out.inv_norm.assign(size_t(N * 2 * H), 0.0);
  out.g.assign(size_t(N * HK), 0.0);
  out.beta.assign(size_t(N * H), 0.0);
  for (int64_t r = 0; r < N; ++r) {
    for (int which = 0; which < 3; ++which)
      for (int64_t j = 0; j < HK; ++j) {
        const double x = in.conv[r * 3 * HK + which * HK + j];
        (*planes[which])[size_t(r * HK + j)] = x * sigmoid(x);
      }
    for (int which = 0; which < 2; ++which)
      for (int64_t h = 0; h < H; ++h) {
        double* head = planes[which]->data() + r * HK + h * K;
        double sq = 0.0;
        for (int64_t j = 0; j < K; ++j) sq += head[j] * head[j];
        const double inv = 1.0 / std::sqrt(sq + 1e-6);
        out.inv_norm[size_t(r * 2 * H + which * H + h)] = inv;
        for (int64_t j = 0; j < K; ++j) head[j] *= inv * (which == 0 ? 1.0 / std::sqrt(double(K)) : 1.0);
      }
    for (int64_t j = 0; j < HK; ++j) {
      const double a = std::exp(in.a_log[j / K]);
      const double z = in.f[r * s.ld_proj + j] + in.dt_bias[j];
      out.g[size_t(r * HK + j)] = lower_bounded ? lower_bound * sigmoid(a * z) : -a * std::log1p(std::exp(z));
    }
    for (int64_t h = 0; h < H; ++h) out.beta[size_t(r * H + h)] = sigmoid(in.b[r * s.ld_proj + h]);
  }
  return out;
}

void kda_output_gate_forward(const float* normed, const float* logits, int64_t ld_logits, int64_t rows,
                             int64_t width, float* gated) {
  const std::vector<double> n = widen(normed, rows * width), l = widen(logits, extent(rows, width, ld_logits));
  std::vector<double> out(n.size());
  reference::kda_output_gate_forward(n.data(), l.data(), ld_logits, rows, width, out.data());
  narrow(out, gated);
}

void kda_output_gate_forward(const double* normed, const double* logits, int64_t ld_logits, int64_t rows,
                             int64_t width, double* gated) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j)
      gated[r * width + j] = normed[r * width + j] * sigmoid(logits[r * ld_logits + j]);
}

void attention_forward(const AttentionDims& dims, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                       const float* q, const float* k, const float* v, float* o, float* lse, Workspace&) {
  const int64_t nq = q_starts[batch], nk = k_starts[batch], H = dims.heads;
  const AttentionDouble r =
      reference::attention(dims, batch, q_starts, k_starts, widen(q, nq * H * dims.qk_dim),
                           widen(k, nk * H * dims.qk_dim), widen(v, nk * H * dims.v_dim), nullptr);
  narrow(r.o, o);
  narrow(r.lse, lse);
}

AttentionDouble attention(const AttentionDims& d, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                          const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                          const float* d_o) {
  const int64_t H = d.heads, Dq = d.qk_dim, Dv = d.v_dim;
  AttentionDouble r;
  r.o.assign(size_t(q_starts[batch] * H * Dv), 0.0);
  r.lse.assign(size_t(q_starts[batch] * H), -INFINITY);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  std::vector<double> prob;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qb = q_starts[b], q_len = q_starts[b + 1] - qb;
    const int64_t kb = k_starts[b], kv_len = k_starts[b + 1] - kb;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t pos = kv_len - q_len + i, row = (qb + i) * H + h;
        const double* qi = &q[size_t(row * Dq)];
        prob.assign(size_t(kv_len), 0.0);
        double mx = -INFINITY;
        for (int64_t s = 0; s < kv_len; ++s) {
          if (!visible(s, pos, d)) continue;
          double dot = 0;
          for (int64_t e = 0; e < Dq; ++e) dot += qi[e] * k[size_t(((kb + s) * H + h) * Dq + e)];
          prob[size_t(s)] = d.scale * dot;
          mx = std::max(mx, prob[size_t(s)]);
        }
        if (mx == -INFINITY) continue;  // sees no key: o = 0, lse = -inf, no gradient
        double sum = 0;
        for (int64_t s = 0; s < kv_len; ++s)
          sum += prob[size_t(s)] = visible(s, pos, d) ? std::exp(prob[size_t(s)] - mx) : 0.0;
        r.lse[size_t(row)] = mx + std::log(sum);
        for (int64_t s = 0; s < kv_len; ++s) {
          prob[size_t(s)] /= sum;
          for (int64_t e = 0; e < Dv; ++e) r.o[size_t(row * Dv + e)] += prob[size_t(s)] * v[size_t(((kb + s) * H + h) * Dv + e)];
        }
        if (!d_o) continue;
        const float* g = &d_o[row * Dv];
        double D = 0;
        for (int64_t e = 0; e < Dv; ++e) D += g[e] * r.o[size_t(row * Dv + e)];
        for (int64_t s = 0; s < kv_len; ++s) {
          if (prob[size_t(s)] == 0.0) continue;
          const int64_t krow = (kb + s) * H + h;
          double dp = 0;
          for (int64_t e = 0; e < Dv; ++e) {
            dp += g[e] * v[size_t(krow * Dv + e)];
            r.dv[size_t(krow * Dv + e)] += prob[size_t(s)] * g[e];
          }
          const double ds = d.scale * prob[size_t(s)] * (dp - D);
          for (int64_t e = 0; e < Dq; ++e) {
            r.dq[size_t(row * Dq + e)] += ds * k[size_t(krow * Dq + e)];
            r.dk[size_t(krow * Dq + e)] += ds * qi[e];
          }
        }
      }
  }
  return r;
}

void latent_attention_decode(const LatentAttentionDims& dims, int64_t batch, const LatentCacheRows* caches,
                             const float* q, float* o, Workspace&) {
  const int64_t H = dims.heads, R = dims.latent, K = dims.latent + dims.rope;
  for (int64_t b = 0; b < batch; ++b) {
    const LatentCacheRows& cache = caches[b];
    const auto row_value = [&](int64_t s, int64_t i) -> double {
      return cache.rows_bf16 ? to_f32(cache.rows_bf16[s * K + i]) : cache.rows_f32[s * K + i];
    };
    const int64_t L = cache.length, first = dims.window ? std::max<int64_t>(0, L - dims.window) : 0;
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + (b * H + h) * K;
      std::vector<double> score(size_t(L), -INFINITY), out(size_t(R), 0.0);
      double mx = -INFINITY;
      for (int64_t s = first; s < L; ++s) {
        double dot = 0;
        for (int64_t i = 0; i < K; ++i) dot += double(qh[i]) * row_value(s, i);
        mx = std::max(mx, score[size_t(s)] = dims.scale * dot);
      }
      double sum = 0;
      for (int64_t s = first; s < L; ++s) sum += score[size_t(s)] = std::exp(score[size_t(s)] - mx);
      for (int64_t s = first; s < L; ++s)
        for (int64_t i = 0; i < R; ++i) out[size_t(i)] += score[size_t(s)] / sum * row_value(s, i);
      narrow(out, o + (b * H + h) * R);
    }
  }
}

}  // namespace hyla::reference
