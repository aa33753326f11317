#include "spec_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hyla::test {

std::vector<double> matvec(const std::vector<double>& W, int64_t out, int64_t in, const double* x) {
  std::vector<double> y(size_t(out), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) y[size_t(o)] += W[size_t(o * in + i)] * x[i];
  return y;
}

std::vector<double> rmsnorm(std::vector<double> x, const std::vector<double>& w, double eps) {
  double ms = 0;
  for (double e : x) ms += e * e / double(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] / std::sqrt(ms + eps) * w[i];
  return x;
}

// SPEC §4, loop by loop, in double.
std::vector<double> reference_mla(const ModelConfig& cfg, LayerType type, const SpecWeights& w,
                                  const std::vector<double>& u, const TokenBatch& tokens) {
  const MlaConfig& m = cfg.mla;
  const int64_t d = cfg.hidden_size, H = m.num_heads, Dn = m.qk_nope_head_dim, Dr = m.qk_rope_head_dim;
  const int64_t Dv = m.v_head_dim, R = m.kv_lora_rank, Q = m.q_lora_rank, qk = Dn + Dr, N = tokens.rows;
  const int64_t window = type == LayerType::Swa ? m.sliding_window : 0;
  auto rotate = [&](double* x, int64_t pos) {
    for (int64_t i = 0; i < Dr / 2; ++i) {
      const double angle = double(pos) * std::pow(m.rope_theta, -2.0 * double(i) / double(Dr));
      const double x0 = x[2 * i], x1 = x[2 * i + 1];
      x[2 * i] = x0 * std::cos(angle) - x1 * std::sin(angle);
      x[2 * i + 1] = x0 * std::sin(angle) + x1 * std::cos(angle);
    }
  };
  std::vector<std::vector<double>> q(static_cast<size_t>(N)), kv(q), k_pe(q), gate(q);
  for (int64_t r = 0; r < N; ++r) {
    const double* ur = &u[size_t(r * d)];
    if (Q == 0) {
      q[size_t(r)] = matvec(w.at("q_proj.weight"), H * qk, d, ur);
    } else {
      const auto qa = rmsnorm(matvec(w.at("q_a_proj.weight"), Q, d, ur), w.at("q_a_layernorm.weight"), cfg.rms_norm_eps);
      q[size_t(r)] = matvec(w.at("q_b_proj.weight"), H * qk, Q, qa.data());
    }
    const auto kva = matvec(w.at("kv_a_proj_with_mqa.weight"), R + Dr, d, ur);
    const auto c = rmsnorm(std::vector<double>(kva.begin(), kva.begin() + R), w.at("kv_a_layernorm.weight"),
                           cfg.rms_norm_eps);
    kv[size_t(r)] = matvec(w.at("kv_b_proj.weight"), H * (Dn + Dv), R, c.data());
    k_pe[size_t(r)].assign(kva.begin() + R, kva.end());
    const int64_t pos = tokens.positions[size_t(r)];
    if (m.rope) {
      rotate(k_pe[size_t(r)].data(), pos);
      for (int64_t h = 0; h < H; ++h) rotate(&q[size_t(r)][size_t(h * qk + Dn)], pos);
    }
    if (m.output_gate) {
      gate[size_t(r)] = matvec(w.at("g_proj.weight"), m.output_gate_per_head ? H : H * Dv, d, ur);
      for (double& g : gate[size_t(r)]) g = 1.0 / (1.0 + std::exp(-g));
    }
  }
  std::vector<double> y(size_t(N * d));
  for (int64_t b = 0; b < tokens.batch(); ++b) {
    const int64_t start = tokens.starts[size_t(b)], T = tokens.length(b);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> o(size_t(H * Dv), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        const double* qh = &q[size_t(start + t)][size_t(h * qk)];
        std::vector<double> score(size_t(T), -INFINITY);
        double mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          if (window && t - s >= window) continue;
          const double* kn = &kv[size_t(start + s)][size_t(h * (Dn + Dv))];
          double dot = 0;
          for (int64_t i = 0; i < Dn; ++i) dot += qh[i] * kn[i];
          for (int64_t i = 0; i < Dr; ++i) dot += qh[Dn + i] * k_pe[size_t(start + s)][size_t(i)];
          mx = std::max(mx, score[size_t(s)] = dot / std::sqrt(double(Dn + Dr)));
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s) sum += score[size_t(s)] = std::exp(score[size_t(s)] - mx);
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t e = 0; e < Dv; ++e)
            o[size_t(h * Dv + e)] += score[size_t(s)] / sum * kv[size_t(start + s)][size_t(h * (Dn + Dv) + Dn + e)];
      }
      if (m.output_gate)
        for (int64_t j = 0; j < H * Dv; ++j)
          o[size_t(j)] *= gate[size_t(start + t)][size_t(m.output_gate_per_head ? j / Dv : j)];
      const auto yr = matvec(w.at("o_proj.weight"), d, H * Dv, o.data());
      std::copy(yr.begin(), yr.end(), y.begin() + (start + t) * d);
    }
  }
  return y;
}


double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// act(a, b) of SPEC §5; `limit` > 0 clamps SwiGLU.
double gate_ref(const MoeConfig& m, Activation act, double limit, double a, double b) {
  if (act == Activation::Swiglu && limit > 0) return std::min(a * sigmoid_ref(a), limit) * std::clamp(b, -limit, limit);
  if (act == Activation::Swiglu) return a * sigmoid_ref(a) * b;
  const double beta = m.situ_beta, lambda = m.situ_linear_beta;
  return beta * std::tanh(a / beta) * sigmoid_ref(a) * (lambda > 0 ? lambda * std::tanh(b / lambda) : b);
}

// Row r of a row-major [rows, cols] matrix times x.
double row_dot(const std::vector<double>& w, int64_t r, int64_t cols, const double* x) {
  double s = 0.0;
  for (int64_t c = 0; c < cols; ++c) s += w[size_t(r * cols + c)] * x[c];
  return s;
}

// out += scale · W_down[:, lo:hi] act(W_gate[lo:hi] x, W_up[lo:hi] x) for an MLP `hidden` wide.
void add_mlp(const SpecWeights& P, const std::string& prefix, int64_t in, int64_t hidden, int64_t lo, int64_t hi,
             const MoeConfig& m, Activation act, double limit, const double* x, double scale, double* out) {
  const auto& gate = P.at(prefix + "gate_proj.weight");
  const auto& up = P.at(prefix + "up_proj.weight");
  const auto& down = P.at(prefix + "down_proj.weight");
  for (int64_t j = lo; j < hi; ++j) {
    const double h = gate_ref(m, act, limit, row_dot(gate, j, in, x), row_dot(up, j, in, x));
    for (int64_t i = 0; i < in; ++i) out[i] += scale * down[size_t(i * hidden + j)] * h;
  }
}


MoeReference reference_moe(const ModelConfig& c, const SpecWeights& P, const std::vector<double>& u, int64_t n) {
  const MoeConfig& m = c.moe;
  const int64_t d = c.hidden_size, E = m.num_experts, k = m.num_experts_per_tok, w = m.moe_intermediate_size;
  const int64_t ell = m.latent_dim, width = ell > 0 ? ell : d, r = m.router_latent_dim;
  const auto& bias = P.at("mlp.gate.e_score_correction_bias");
  MoeReference ref;
  ref.y.assign(static_cast<size_t>(n * d), 0.0);
  std::vector<double> all_scores(static_cast<size_t>(n * E));
  for (int64_t t = 0; t < n; ++t) {
    const double* ut = u.data() + t * d;
    std::vector<double> s(static_cast<size_t>(E));
    if (r == 0) {
      for (int64_t e = 0; e < E; ++e) s[e] = sigmoid_ref(row_dot(P.at("mlp.gate.weight"), e, d, ut));
    } else {
      std::vector<double> h(static_cast<size_t>(r));
      for (int64_t i = 0; i < r; ++i) h[i] = row_dot(P.at("mlp.gate.proj.weight"), i, d, ut);
      for (int64_t e = 0; e < E; ++e) s[e] = sigmoid_ref(row_dot(P.at("mlp.gate.centres"), e, r, h.data()));
    }
    std::copy(s.begin(), s.end(), all_scores.begin() + t * E);
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
    if (k < E) ref.min_gap = std::min(ref.min_gap, (s[order[k - 1]] + bias[order[k - 1]]) - (s[order[k]] + bias[order[k]]));
    double z = 0.0;
    for (int64_t i = 0; i < k; ++i) z += s[order[i]];

    std::vector<double> x(ut, ut + d);
    if (ell > 0)
      for (int64_t i = 0; i < ell; ++i) x[i] = row_dot(P.at("mlp.lat_down.weight"), i, d, ut);
    x.resize(static_cast<size_t>(width));
    std::vector<double> mt(static_cast<size_t>(width), 0.0);
    for (int64_t i = 0; i < k; ++i) {
      const int e = order[i];
      ref.selected.push_back(e);
      add_mlp(P, "mlp.experts." + std::to_string(e) + ".", width, w, 0, w, m, m.activation, m.swiglu_limit, x.data(),
              s[e] / z * m.routed_scaling_factor, mt.data());
    }
    // SharedExpert_sh: its slice of the stored matrices (or the one MLP of shared_intermediate_size),
    // on x_e into m, or (shared_full_width with a latent) on u into y after lat_up.
    const bool after_up = m.shared_full_width && ell > 0;
    auto add_shared = [&](const double* input, int64_t in, double* out) {
      const int64_t slice = m.shared_intermediate_size > 0 ? m.shared_intermediate_size : w;
      for (int64_t lo = 0; m.num_shared_experts > 0 && lo < m.shared_width(); lo += slice)
        add_mlp(P, "mlp.shared_experts.", in, m.shared_width(), lo, lo + slice, m, m.shared_activation,
                m.shared_swiglu_limit, input, 1.0, out);
    };
    if (!after_up) add_shared(x.data(), width, mt.data());
    double* yt = ref.y.data() + t * d;
    if (ell == 0) {
      std::copy(mt.begin(), mt.end(), yt);
    } else {
      std::vector<double> normed = mt;
      if (m.latent_norm) {
        double ms = 0.0;
        for (double v : mt) ms += v * v;
        const double rstd = 1.0 / std::sqrt(ms / double(ell) + c.rms_norm_eps);
        for (int64_t i = 0; i < ell; ++i) normed[i] = mt[i] * rstd * P.at("mlp.lat_norm.weight")[i];
      }
      for (int64_t i = 0; i < d; ++i) yt[i] = row_dot(P.at("mlp.lat_up.weight"), i, ell, normed.data());
    }
    if (after_up) add_shared(ut, d, yt);
  }
  if (m.balancing == Balancing::AuxLoss) {
    std::vector<double> f(static_cast<size_t>(E), 0.0), p(static_cast<size_t>(E), 0.0);
    for (int e : ref.selected) f[e] += 1.0 / double(n * k);
    for (int64_t t = 0; t < n; ++t) {
      double total = 0.0;
      for (int64_t e = 0; e < E; ++e) total += all_scores[t * E + e];
      for (int64_t e = 0; e < E; ++e) p[e] += all_scores[t * E + e] / total / double(n);
    }
    for (int64_t e = 0; e < E; ++e) ref.aux += m.aux_loss_coef * double(E) * f[e] * p[e];
  }
  return ref;
}

std::vector<double> reference_dense(const ModelConfig& c, const SpecWeights& P, const std::vector<double>& u, int64_t n) {
  const int64_t d = c.hidden_size;
  std::vector<double> y(static_cast<size_t>(n * d), 0.0);
  for (int64_t t = 0; t < n; ++t)
    add_mlp(P, "mlp.", d, c.moe.intermediate_size, 0, c.moe.intermediate_size, c.moe, c.moe.dense_activation, 0.0,
            u.data() + t * d, 1.0, y.data() + t * d);
  return y;
}


std::vector<double> reference_kda(const ModelConfig& c, const SpecWeights& w, const std::vector<int64_t>& starts,
                                  const std::vector<double>& u) {
  using Doubles = std::vector<double>;
  const int64_t d = c.hidden_size, H = c.kda.num_heads, K = c.kda.head_dim, HK = H * K, kernel = c.kda.conv_kernel;
  const int64_t N = starts.back();
  auto linear = [&](const std::string& name, const Doubles& x, int64_t in, int64_t out) {
    const Doubles& W = w.at(name + ".weight");
    Doubles y(size_t(N * out), 0.0);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) y[size_t(r * out + o)] += W[size_t(o * in + i)] * x[size_t(r * in + i)];
    return y;
  };
  auto conv_silu = [&](const std::string& name, const Doubles& x) {
    const Doubles& W = w.at(name);
    Doubles y(x.size(), 0.0);
    for (size_t b = 0; b + 1 < starts.size(); ++b)
      for (int64_t t = starts[b]; t < starts[b + 1]; ++t)
        for (int64_t ch = 0; ch < HK; ++ch) {
          double s = 0;
          for (int64_t j = 0; j < kernel; ++j) {
            const int64_t src = t - kernel + 1 + j;
            if (src >= starts[b]) s += W[size_t(ch * kernel + j)] * x[size_t(src * HK + ch)];
          }
          y[size_t(t * HK + ch)] = s * sigmoid_ref(s);
        }
    return y;
  };
  Doubles q = conv_silu("q_conv1d.weight", linear("q_proj", u, d, HK));
  Doubles k = conv_silu("k_conv1d.weight", linear("k_proj", u, d, HK));
  const Doubles v = conv_silu("v_conv1d.weight", linear("v_proj", u, d, HK));
  // A gate's logits: W u, or W_b (W_a u) through `rank`.
  auto gate_logits = [&](const std::string& name, int64_t rank) {
    return rank == 0 ? linear(name + "_proj", u, d, HK)
                     : linear(name + "_b_proj", linear(name + "_a_proj", u, d, rank), rank, HK);
  };
  const Doubles f = gate_logits("f", c.kda.gate_rank), gl = gate_logits("g", c.kda.output_gate_rank);
  const Doubles bl = linear("b_proj", u, d, H);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (Doubles* x : {&q, &k}) {
        double s = 0;
        for (int64_t j = 0; j < K; ++j) s += std::pow((*x)[size_t(r * HK + h * K + j)], 2);
        const double scale = 1.0 / std::sqrt(s + 1e-6) * (x == &q ? 1.0 / std::sqrt(double(K)) : 1.0);
        for (int64_t j = 0; j < K; ++j) (*x)[size_t(r * HK + h * K + j)] *= scale;
      }
  Doubles o(size_t(N * HK), 0.0), S(size_t(K * K));
  for (size_t b = 0; b + 1 < starts.size(); ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::fill(S.begin(), S.end(), 0.0);
      for (int64_t t = starts[b]; t < starts[b + 1]; ++t) {
        const double a = std::exp(w.at("A_log")[size_t(h)]), beta = sigmoid_ref(bl[size_t(t * H + h)]);
        for (int64_t i = 0; i < K; ++i) {
          const double z = f[size_t(t * HK + h * K + i)] + w.at("dt_bias")[size_t(h * K + i)];
          const double g = c.kda.gate == KdaGate::LowerBound ? c.kda.gate_lower_bound * sigmoid_ref(a * z)
                                                             : -a * std::log1p(std::exp(z));
          for (int64_t j = 0; j < K; ++j) S[size_t(i * K + j)] *= std::exp(g);
        }
        const double* kt = &k[size_t(t * HK + h * K)];
        for (int64_t j = 0; j < K; ++j) {
          double e = v[size_t(t * HK + h * K + j)];
          for (int64_t i = 0; i < K; ++i) e -= S[size_t(i * K + j)] * kt[i];
          for (int64_t i = 0; i < K; ++i) S[size_t(i * K + j)] += beta * kt[i] * e;
        }
        for (int64_t j = 0; j < K; ++j)
          for (int64_t i = 0; i < K; ++i) o[size_t(t * HK + h * K + j)] += S[size_t(i * K + j)] * q[size_t(t * HK + h * K + i)];
      }
    }
  Doubles gated(o.size());
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      double ms = 0;
      for (int64_t j = 0; j < K; ++j) ms += std::pow(o[size_t(r * HK + h * K + j)], 2) / double(K);
      for (int64_t j = 0; j < K; ++j) {
        const size_t x = size_t(r * HK + h * K + j);
        gated[x] = o[x] / std::sqrt(ms + c.rms_norm_eps) * w.at("o_norm.weight")[size_t(j)] * sigmoid_ref(gl[x]);
      }
    }
  return linear("o_proj", gated, HK, d);
}


namespace {

// PyTorch's source taps along one axis (align_corners=False), in double.
std::vector<std::pair<int64_t, double>> resize_taps(GridResample mode, int64_t o, int64_t in, int64_t out) {
  double s = double(in) / double(out) * (double(o) + 0.5) - 0.5;
  auto clamp = [&](int64_t i) { return std::min(std::max<int64_t>(i, 0), in - 1); };
  if (mode == GridResample::Bilinear) {
    s = std::max(s, 0.0);
    const int64_t i0 = int64_t(s);
    return {{clamp(i0), 1 - (s - double(i0))}, {clamp(i0 + 1), s - double(i0)}};
  }
  const double a = -0.75, f = std::floor(s), t = s - f;
  auto kernel = [a](double d) {
    d = std::abs(d);
    return d <= 1 ? (a + 2) * d * d * d - (a + 3) * d * d + 1 : a * d * d * d - 5 * a * d * d + 8 * a * d - 4 * a;
  };
  std::vector<std::pair<int64_t, double>> r;
  for (int k = -1; k <= 2; ++k) r.push_back({clamp(int64_t(f) + k), kernel(t - k)});
  return r;
}

// y[n, out] = x[n, in]·Wᵀ (+ b when `bias`), W = name.weight.
std::vector<double> linear_rows(const std::vector<double>& x, int64_t n, const ParamValues& P, const std::string& name,
                                int64_t out, int64_t in, bool bias) {
  const std::vector<double>& w = P.at(name + ".weight");
  std::vector<double> y(size_t(n * out));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias ? P.at(name + ".bias")[size_t(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

// Each `dim`-wide row of x normalised in place: LayerNorm with bias, or RMSNorm.
void norm_rows(std::vector<double>& x, int64_t dim, const ParamValues& P, const std::string& name, bool layer_norm,
               double eps) {
  const std::vector<double>& w = P.at(name + ".weight");
  for (size_t r = 0; r < x.size() / size_t(dim); ++r) {
    double* row = &x[r * size_t(dim)];
    double mean = 0, var = 0;
    if (layer_norm) {
      for (int64_t j = 0; j < dim; ++j) mean += row[j];
      mean /= double(dim);
    }
    for (int64_t j = 0; j < dim; ++j) var += (row[j] - mean) * (row[j] - mean);
    const double inv = 1 / std::sqrt(var / double(dim) + eps);
    for (int64_t j = 0; j < dim; ++j)
      row[j] = (row[j] - mean) * inv * w[size_t(j)] + (layer_norm ? P.at(name + ".bias")[size_t(j)] : 0.0);
  }
}

}  // namespace

std::vector<double> reference_moonvit(const VisionConfig& v, int64_t d, const ParamValues& P, int64_t R, int64_t C,
                                      const std::vector<double>& patches) {
  const MoonVitConfig& c = v.moonvit;
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, inner = H * hd, I = c.intermediate_size;
  const int64_t n = R * C, m = c.merge, values = v.channels * v.patch_size * v.patch_size;
  const bool ln = c.norm == VisionNorm::LayerNorm;
  std::vector<double> x = linear_rows(patches, n, P, "vision_tower.patch_embed.proj", D, values, c.bias);
  const std::vector<double>& pos = P.at("vision_tower.patch_embed.pos_emb.weight");
  for (int64_t r = 0; r < R; ++r)
    for (int64_t col = 0; col < C; ++col)
      for (const auto& [i, wi] : resize_taps(c.pos_emb_resample, r, c.pos_emb_height, R))
        for (const auto& [j, wj] : resize_taps(c.pos_emb_resample, col, c.pos_emb_width, C))
          for (int64_t e = 0; e < D; ++e)
            x[size_t((r * C + col) * D + e)] += wi * wj * pos[size_t((i * c.pos_emb_width + j) * D + e)];
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(l);
    std::vector<double> h = x;
    norm_rows(h, D, P, p + ".norm0", ln, c.norm_eps);
    std::vector<double> qkv = linear_rows(h, n, P, p + ".wqkv", 3 * inner, D, c.bias);
    // 2-D rotary positions on q and k: dims (4i, 4i+1) by column·f_i, (4i+2, 4i+3) by row·f_i.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t part = 0; part < 2; ++part)
        for (int64_t head = 0; head < H; ++head) {
          double* q = &qkv[size_t(t * 3 * inner + part * inner + head * hd)];
          for (int64_t i = 0; i < hd / 4; ++i) {
            const double f = std::pow(c.rope_theta, -4.0 * double(i) / double(hd));
            for (int64_t axis = 0; axis < 2; ++axis) {
              const double angle = double(axis == 0 ? t % C : t / C) * f;
              const double a = q[4 * i + 2 * axis], b = q[4 * i + 2 * axis + 1];
              q[4 * i + 2 * axis] = a * std::cos(angle) - b * std::sin(angle);
              q[4 * i + 2 * axis + 1] = a * std::sin(angle) + b * std::cos(angle);
            }
          }
        }
    std::vector<double> o(size_t(n * inner), 0.0), scores(static_cast<size_t>(n));
    for (int64_t head = 0; head < H; ++head)
      for (int64_t t = 0; t < n; ++t) {
        double mx = -INFINITY, sum = 0;
        for (int64_t s = 0; s < n; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += qkv[size_t(t * 3 * inner + head * hd + e)] * qkv[size_t(s * 3 * inner + inner + head * hd + e)];
          scores[size_t(s)] = dot / std::sqrt(double(hd));
          mx = std::max(mx, scores[size_t(s)]);
        }
        for (int64_t s = 0; s < n; ++s) sum += scores[size_t(s)] = std::exp(scores[size_t(s)] - mx);
        for (int64_t s = 0; s < n; ++s)
          for (int64_t e = 0; e < hd; ++e)
            o[size_t(t * inner + head * hd + e)] +=
                scores[size_t(s)] / sum * qkv[size_t(s * 3 * inner + 2 * inner + head * hd + e)];
      }
    const std::vector<double> attn = linear_rows(o, n, P, p + ".wo", D, inner, c.bias);
    for (size_t i = 0; i < x.size(); ++i) x[i] += attn[i];
    h = x;
    norm_rows(h, D, P, p + ".norm1", ln, c.norm_eps);
    std::vector<double> u = linear_rows(h, n, P, p + ".mlp.fc0", I, D, c.bias);
    for (double& e : u) e = 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)));
    const std::vector<double> mlp = linear_rows(u, n, P, p + ".mlp.fc1", D, I, c.bias);
    for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
  }
  norm_rows(x, D, P, "vision_tower.encoder.final_layernorm", ln, c.norm_eps);
  const bool v1 = c.projector == VisionProjector::PatchMerger;
  if (v1) norm_rows(x, D, P, "mm_projector.pre_norm", true, c.projector_eps);  // per patch, before the merge
  const int64_t tokens = (R / m) * (C / m), merged = m * m * D;
  std::vector<double> cat;
  for (int64_t gi = 0; gi < R / m; ++gi)
    for (int64_t gj = 0; gj < C / m; ++gj)
      for (int64_t wi = 0; wi < m; ++wi)
        for (int64_t wj = 0; wj < m; ++wj) {
          const double* row = &x[size_t(((gi * m + wi) * C + gj * m + wj) * D)];
          cat.insert(cat.end(), row, row + D);
        }
  std::vector<double> mid = linear_rows(cat, tokens, P, "mm_projector.proj.0", merged, merged, v1);
  for (double& e : mid)
    e = c.projector_gelu == Gelu::Erf ? 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)))
                                      : 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)));
  std::vector<double> out = linear_rows(mid, tokens, P, "mm_projector.proj.2", d, merged, v1);
  if (!v1) norm_rows(out, d, P, "mm_projector.post_norm", false, c.projector_eps);
  return out;
}

std::vector<double> reference_logits(const ModelConfig& c, const ParamValues& params, const TokenBatch& tokens,
                                     const std::vector<int32_t>& ids, const std::vector<Image>& images,
                                     int32_t image_pad_id) {
  using Rows = std::vector<double>;  // [N, d]
  const int64_t d = c.hidden_size, N = tokens.rows, V = c.vocab_size;
  const SpecWeights all{&params, ""};
  Rows x(size_t(N * d));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < d; ++j) x[size_t(r * d + j)] = all.at("model.embed_tokens.weight")[size_t(ids[size_t(r)] * d + j)];
  // §7.2: pad rows, in order, take each image's MoonViT rows, its patches (x/255 − mean)/std.
  int64_t row = 0;
  for (const Image& img : images) {
    if (c.vision.tower != VisionTower::MoonVit) break;
    const MoonVitConfig& m = c.vision.moonvit;
    const int64_t P = c.vision.patch_size, R = img.height / P, C = img.width / P;
    std::vector<double> patches;
    for (int64_t gr = 0; gr < R; ++gr)
      for (int64_t gc = 0; gc < C; ++gc)
        for (int64_t ch = 0; ch < 3; ++ch)
          for (int64_t y = 0; y < P; ++y)
            for (int64_t xx = 0; xx < P; ++xx)
              patches.push_back((img.pixels[size_t(((gr * P + y) * img.width + gc * P + xx) * 3 + ch)] / 255.0 -
                                 m.image_mean[size_t(ch)]) / m.image_std[size_t(ch)]);
    const std::vector<double> rows = reference_moonvit(c.vision, d, params, R, C, patches);
    for (size_t t = 0; t < rows.size() / size_t(d); ++t) {
      while (ids[size_t(row)] != image_pad_id) ++row;
      std::copy(rows.begin() + int64_t(t) * d, rows.begin() + int64_t(t + 1) * d, x.begin() + row * d);
      ++row;
    }
  }
  // §7.1: pad rows, in order, take W_patch · patch + b + row_embed[r] + col_embed[c].
  for (const Image& img : images) {
    if (c.vision.tower == VisionTower::MoonVit) break;
    const int64_t P = c.vision.patch_size, C = img.channels;
    for (int64_t gr = 0; gr < img.height / P; ++gr)
      for (int64_t gc = 0; gc < img.width / P; ++gc) {
        while (ids[size_t(row)] != image_pad_id) ++row;
        std::vector<double> patch;
        for (int64_t y = 0; y < P; ++y)
          for (int64_t xx = 0; xx < P; ++xx)
            for (int64_t ch = 0; ch < C; ++ch)
              patch.push_back((img.pixels[size_t(((gr * P + y) * img.width + gc * P + xx) * C + ch)] / 255.0 - 0.5) / 0.5);
        const std::vector<double> e = matvec(all.at("model.vision.patch_proj.weight"), d, P * P * C, patch.data());
        for (int64_t j = 0; j < d; ++j)
          x[size_t(row * d + j)] = e[size_t(j)] + all.at("model.vision.patch_proj.bias")[size_t(j)] +
                                   all.at("model.vision.row_embed")[size_t(gr * d + j)] +
                                   all.at("model.vision.col_embed")[size_t(gc * d + j)];
        ++row;
      }
  }
  auto norm_rows = [&](const Rows& in, const std::string& weight) {
    Rows out(in.size());
    for (int64_t r = 0; r < N; ++r) {
      const Rows row(in.begin() + r * d, in.begin() + (r + 1) * d);
      const Rows n = rmsnorm(row, all.at(weight), c.rms_norm_eps);
      std::copy(n.begin(), n.end(), out.begin() + r * d);
    }
    return out;
  };
  // SPEC §6: AR(sources; w, γ) = Σ_n softmax_n(w · RMSNorm_γ(V_n)) V_n, per token.
  auto attn_res = [&](const std::vector<const Rows*>& sources, const std::string& query, const std::string& norm) {
    Rows h(size_t(N * d), 0.0);
    for (int64_t r = 0; r < N; ++r) {
      std::vector<double> z;
      for (const Rows* v : sources) {
        const Rows row(v->begin() + r * d, v->begin() + (r + 1) * d);
        const Rows n = rmsnorm(row, all.at(norm), c.rms_norm_eps);
        double dot = 0;
        for (int64_t j = 0; j < d; ++j) dot += all.at(query)[size_t(j)] * n[size_t(j)];
        z.push_back(dot);
      }
      const double top = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (double& e : z) sum += e = std::exp(e - top);
      for (size_t s = 0; s < sources.size(); ++s)
        for (int64_t j = 0; j < d; ++j) h[size_t(r * d + j)] += z[s] / sum * (*sources[s])[size_t(r * d + j)];
    }
    return h;
  };
  const bool res = c.attn_res.enabled;
  std::vector<Rows> blocks{x};
  Rows partial;  // empty: none
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (res && l > 0 && l % c.attn_res.block_size == 0) {
      blocks.push_back(partial);
      partial.clear();
    }
    auto sources = [&] {
      std::vector<const Rows*> s;
      for (const Rows& b : blocks) s.push_back(&b);
      if (!partial.empty()) s.push_back(&partial);
      return s;
    };
    auto add = [&](const Rows& out) {
      Rows& target = res ? partial : x;
      if (target.empty()) target = out;
      else
        for (size_t i = 0; i < out.size(); ++i) target[i] += out[i];
    };
    Rows h = res ? attn_res(sources(), p + "attn_res_query", p + "attn_res_norm.weight") : x;
    Rows u = norm_rows(h, p + "input_layernorm.weight");
    const LayerType type = c.layer_types[size_t(l)];
    add(type == LayerType::Kda ? reference_kda(c, {&params, p + "self_attn."}, tokens.starts, u)
                               : reference_mla(c, type, {&params, p + "self_attn."}, u, tokens));
    h = res ? attn_res(sources(), p + "mlp_res_query", p + "mlp_res_norm.weight") : x;
    u = norm_rows(h, p + "post_attention_layernorm.weight");
    add(c.is_moe_layer(l) ? reference_moe(c, {&params, p}, u, N).y : reference_dense(c, {&params, p}, u, N));
  }
  const Rows final_h = res ? attn_res([&] {
    std::vector<const Rows*> s;
    for (const Rows& b : blocks) s.push_back(&b);
    s.push_back(&partial);
    return s;
  }(), "model.out_res_query", "model.out_res_norm.weight") : x;
  const Rows normed = norm_rows(final_h, "model.norm.weight");
  const std::vector<double>& head = c.tie_word_embeddings ? all.at("model.embed_tokens.weight") : all.at("lm_head.weight");
  Rows logits(size_t(N * V));
  for (int64_t r = 0; r < N; ++r) {
    const Rows y = matvec(head, V, d, normed.data() + r * d);
    std::copy(y.begin(), y.end(), logits.begin() + r * V);
  }
  return logits;
}

}  // namespace hyla::test
