#include "hyla/model/kda_mixer.h"

#include <cmath>

#include "hyla/core/threads.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/conv1d.h"
#include "hyla/kernels/norm.h"
#include "hyla/kernels/vmath.h"

namespace hyla {
namespace {

constexpr float kL2Eps = 1e-6f;  // SPEC §3: x / sqrt(Σx² + 1e-6)

void grow(Tensor& t, int64_t rows, int64_t cols) {
  if (!t.defined() || t.numel() < rows * cols) t = Tensor::empty(DType::F32, {std::max<int64_t>(rows * cols, 1)});
}

// out[c] += Σ_r x[r, c] for an rows × cols block (row stride ld).
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

}  // namespace

KdaMixer::KdaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : config_(config),
      heads_(config.kda.num_heads),
      head_dim_(config.kda.head_dim),
      width_(config.kda.num_heads * config.kda.head_dim),
      gate_lower_bound_(float(config.kda.gate_lower_bound)) {
  const int64_t d = config.hidden_size, HK = width_;
  const Component c = Component::Kda;
  q_proj_ = Linear(store, prefix + "q_proj", d, HK, c);
  k_proj_ = Linear(store, prefix + "k_proj", d, HK, c);
  v_proj_ = Linear(store, prefix + "v_proj", d, HK, c);
  f_proj_ = Linear(store, prefix + "f_proj", d, HK, c);
  g_proj_ = Linear(store, prefix + "g_proj", d, HK, c);
  b_proj_ = Linear(store, prefix + "b_proj", d, heads_, c);
  in_proj_ = Linear::fuse({&q_proj_, &k_proj_, &v_proj_, &f_proj_, &g_proj_, &b_proj_});
  o_proj_ = Linear(store, prefix + "o_proj", HK, d, c, Init::NormalOutput);
  const Shape conv{HK, 1, config.kda.conv_kernel};
  q_conv_ = &store.add(prefix + "q_conv1d.weight", conv, Init::ConvUniform, c);
  k_conv_ = &store.add(prefix + "k_conv1d.weight", conv, Init::ConvUniform, c);
  v_conv_ = &store.add(prefix + "v_conv1d.weight", conv, Init::ConvUniform, c);
  a_log_ = &store.add(prefix + "A_log", {heads_}, Init::ALog, c, /*weight_decay=*/false);
  dt_bias_ = &store.add(prefix + "dt_bias", {HK}, Init::DtBias, c, /*weight_decay=*/false);
  o_norm_ = RmsNorm(store, prefix + "o_norm", head_dim_, c, float(config.rms_norm_eps));
}

KdaOptions KdaMixer::kernel_options(bool backward, Precision p) const {
  KdaOptions o;
  const bool bounded = config_.kda.gate == KdaGate::LowerBound;
  o.bf16_matmul = p == Precision::BF16;
  o.path = kda_fastest_path(head_dim_, head_dim_, backward, o.bf16_matmul, bounded);
  o.chunk_size = config_.kda.chunk_size;
  o.gate_lower_bound = gate_lower_bound_;
  return o;
}

// Projections, convs (continuing from `conv_tails` when given: three [kernel-1, HK] tails per
// sequence, q k v), activations, L2 norms, decays and β for the rows of ctx.tokens.
void KdaMixer::project_and_prepare(const float* u, const ForwardContext& ctx, const float* const* conv_tails) {
  const int64_t N = ctx.tokens.rows, HK = width_, H = heads_, K = head_dim_, P = in_proj_.out();
  rows_ = N;
  u_ = u;
  grow(proj_, N, P);
  grow(conv_, N, 3 * HK);
  grow(qkv_, N, 3 * HK);
  grow(inv_norm_, N, 2 * H);
  grow(decay_, N, HK);
  grow(beta_, N, H);
  in_proj_.forward(u, N, proj_.data<float>(), ctx.precision);

  const Conv1dShape conv{HK, config_.kda.conv_kernel, ctx.tokens.batch(), ctx.tokens.starts.data()};
  const Param* weights[3] = {q_conv_, k_conv_, v_conv_};
  std::vector<const float*> tails(static_cast<size_t>(ctx.tokens.batch()));
  for (int which = 0; which < 3; ++which) {
    for (int64_t b = 0; b < ctx.tokens.batch(); ++b)
      tails[size_t(b)] = conv_tails ? conv_tails[b] + which * (conv.kernel - 1) * HK : nullptr;
    causal_conv1d_forward(conv, proj_.data<float>() + which * HK, P, weights[which]->value.data<float>(),
                          conv_tails ? tails.data() : nullptr, conv_.data<float>() + which * HK, 3 * HK);
  }
  const float q_scale = 1.0f / std::sqrt(float(K));
  const float lb = gate_lower_bound_;
  const bool bounded = config_.kda.gate == KdaGate::LowerBound;
  const float* a_log = a_log_->value.data<float>();
  const float* dt_bias = dt_bias_->value.data<float>();
#pragma omp parallel for schedule(static) if (worth_parallel(N * 3 * HK))
  for (int64_t r = 0; r < N; ++r) {
    const float* c = conv_.data<float>() + r * 3 * HK;
    for (int which = 0; which < 3; ++which) {
      float* x = plane(which) + r * HK;
      std::copy(c + which * HK, c + (which + 1) * HK, x);
      silu_inplace(x, HK);
    }
    for (int64_t h = 0; h < H; ++h)
      for (int which = 0; which < 2; ++which) {  // q then k
        float* head = plane(which) + r * HK + h * K;
        const float inv = 1.0f / std::sqrt(dot(head, head, K) + kL2Eps);
        inv_norm_.data<float>()[r * 2 * H + which * H + h] = inv;
        const float scale = inv * (which == 0 ? q_scale : 1.0f);
        for (int64_t j = 0; j < K; ++j) head[j] *= scale;
      }
    const float* z_in = proj_.data<float>() + r * P + 3 * HK;
    float* g = decay_.data<float>() + r * HK;
    for (int64_t h = 0; h < H; ++h) {
      const float a = std::exp(a_log[h]);
      for (int64_t j = h * K; j < (h + 1) * K; ++j) {
        const float z = z_in[j] + dt_bias[j];
        g[j] = bounded ? lb * sigmoid(a * z) : -a * softplus(z);
      }
    }
    const float* b_in = proj_.data<float>() + r * P + 5 * HK;
    for (int64_t h = 0; h < H; ++h) beta_.data<float>()[r * H + h] = sigmoid(b_in[h]);
  }
}

// y = o_proj(RMSNorm(o) per head ⊙ σ(gate)).
void KdaMixer::output(float* y, const ForwardContext& ctx, bool save) {
  const int64_t N = rows_, HK = width_, H = heads_, K = head_dim_, P = in_proj_.out();
  grow(normed_, N, HK);
  grow(gated_, N, HK);
  grow(rstd_, N, H);
  rmsnorm_forward(o_.data<float>(), K, o_norm_.weight().value.data<float>(), N * H, K, float(config_.rms_norm_eps),
                  normed_.data<float>(), K, save ? rstd_.data<float>() : nullptr);
#pragma omp parallel for schedule(static) if (worth_parallel(N * HK))
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = proj_.data<float>() + r * P + 4 * HK;
    const float* n = normed_.data<float>() + r * HK;
    float* out = gated_.data<float>() + r * HK;
    for (int64_t j = 0; j < HK; ++j) out[j] = n[j] * sigmoid(gate[j]);
  }
  o_proj_.forward(gated_.data<float>(), N, y, ctx.precision);
}

void KdaMixer::forward(const float* u, float* y, const ForwardContext& ctx, std::span<LayerCache* const> caches) {
  if (!caches.empty()) return forward_cached(u, y, ctx, caches);
  project_and_prepare(u, ctx, nullptr);
  grow(o_, rows_, width_);
  const KdaInputs in{ctx.tokens.batch(), ctx.tokens.starts.data(), plane(0), plane(1), plane(2),
                     decay_.data<float>(), beta_.data<float>(), nullptr};
  kda_forward({heads_, head_dim_, head_dim_}, in, kernel_options(ctx.save_for_backward, ctx.precision),
              o_.data<float>(), nullptr, ctx.save_for_backward ? &saved_states_ : nullptr, ctx.workspace);
  output(y, ctx, ctx.save_for_backward);
  tokens_ = &ctx.tokens;
  precision_ = ctx.precision;
  workspace_ = &ctx.workspace;
}

void KdaMixer::forward_cached(const float* u, float* y, const ForwardContext& ctx, std::span<LayerCache* const> caches) {
  const int64_t B = ctx.tokens.batch();
  HYLA_ASSERT(int64_t(caches.size()) == B && !ctx.save_for_backward);
  std::vector<float*> tails(static_cast<size_t>(B)), states(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const RecurrentState& cache = std::get<RecurrentState>(*caches[size_t(b)]);
    tails[size_t(b)] = cache.conv_tails, states[size_t(b)] = cache.state;
  }
  project_and_prepare(u, ctx, tails.data());
  const Conv1dShape conv{width_, config_.kda.conv_kernel, B, ctx.tokens.starts.data()};
  std::vector<float*> tail(static_cast<size_t>(B));
  for (int which = 0; which < 3; ++which) {
    for (int64_t b = 0; b < B; ++b) tail[size_t(b)] = tails[size_t(b)] + which * (conv.kernel - 1) * width_;
    causal_conv1d_update_tails(conv, proj_.data<float>() + which * width_, in_proj_.out(), tail.data());
  }
  grow(o_, rows_, width_);
  const KdaShape shape{heads_, head_dim_, head_dim_};
  bool decode = true;
  for (int64_t b = 0; b < B; ++b) decode &= ctx.tokens.length(b) == 1;
  if (decode) {
    kda_decode_step(shape, B, plane(0), plane(1), plane(2), decay_.data<float>(), beta_.data<float>(), states.data(),
                    o_.data<float>());
  } else {
    const KdaInputs in{B, ctx.tokens.starts.data(), plane(0), plane(1), plane(2), decay_.data<float>(),
                       beta_.data<float>(), states.data()};
    kda_forward(shape, in, kernel_options(false, ctx.precision), o_.data<float>(), states.data(), nullptr, ctx.workspace);
  }
  output(y, ctx, false);
}

void KdaMixer::backward(const float* dy, float* du) {
  HYLA_ASSERT(tokens_ && u_);
  const TokenBatch& tokens = *tokens_;
  const int64_t N = rows_, HK = width_, H = heads_, K = head_dim_, P = in_proj_.out();
  const Precision p = precision_;
  grow(grad_proj_, N, P);
  grow(grad_out_, N, HK);
  grow(grad_qkvg_, 4 * N, HK);
  grow(grad_beta_, N, H);
  float* dproj = grad_proj_.data<float>();
  float* dgated = grad_out_.data<float>();

  // y = o_proj(gated), gated = normed ⊙ σ(gate).
  o_proj_.backward_input(dy, N, dgated, p);
  o_proj_.backward_weight(gated_.data<float>(), dy, N, p);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* gate = proj_.data<float>() + r * P + 4 * HK;
    const float* n = normed_.data<float>() + r * HK;
    float* dg = dgated + r * HK;
    float* dgate = dproj + r * P + 4 * HK;
    for (int64_t j = 0; j < HK; ++j) {
      const float s = sigmoid(gate[j]);
      dgate[j] = dg[j] * n[j] * s * (1.0f - s);
      dg[j] *= s;  // now d(normed)
    }
  }
  // normed = RMSNorm_{o_norm}(o) per head: do overwrites dgated in place.
  rmsnorm_backward(o_.data<float>(), K, o_norm_.weight().value.data<float>(), rstd_.data<float>(), dgated, K, N * H,
                   K, dgated, K, /*accumulate_dx=*/false, o_norm_.weight().g());

  // The delta rule.
  float* dq = grad_qkvg_.data<float>();
  float* dk = dq + N * HK;
  float* dv = dk + N * HK;
  float* dg = dv + N * HK;
  float* dbeta = grad_beta_.data<float>();
  const KdaInputs in{tokens.batch(), tokens.starts.data(), plane(0), plane(1), plane(2), decay_.data<float>(),
                     beta_.data<float>(), nullptr};
  kda_backward({heads_, head_dim_, head_dim_}, in, kernel_options(true, p), dgated, nullptr, saved_states_,
               {dq, dk, dv, dg, dbeta, nullptr}, *workspace_);

  const float q_scale = 1.0f / std::sqrt(float(K));
  const float lb = gate_lower_bound_;
  const bool bounded = config_.kda.gate == KdaGate::LowerBound;
  const float* a_log = a_log_->value.data<float>();
  const float* dt_bias = dt_bias_->value.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    float* row = dproj + r * P;
    // β = σ(b).
    for (int64_t h = 0; h < H; ++h) {
      const float b = beta_.data<float>()[r * H + h];
      row[5 * HK + h] = dbeta[r * H + h] * b * (1.0f - b);
    }
    // g = lb·σ(a z) or -a·softplus(z), z = f + dt_bias: dz into the f columns; dA_log is summed below.
    const float* z_in = proj_.data<float>() + r * P + 3 * HK;
    for (int64_t h = 0; h < H; ++h) {
      const float a = std::exp(a_log[h]);
      for (int64_t j = h * K; j < (h + 1) * K; ++j) {
        const float z = z_in[j] + dt_bias[j], d = dg[r * HK + j];
        if (bounded) {
          const float s = sigmoid(a * z);
          row[3 * HK + j] = d * lb * s * (1.0f - s) * a;
        } else {
          row[3 * HK + j] = -d * a * sigmoid(z);
        }
      }
    }
    // q, k: x ↦ x / sqrt(Σx² + eps) (· K^-1/2 for q), after silu; v: silu. Back to the conv outputs.
    const float* c = conv_.data<float>() + r * 3 * HK;
    for (int which = 0; which < 3; ++which) {
      float* d = (which == 0 ? dq : which == 1 ? dk : dv) + r * HK;
      if (which < 2) {
        const float scale = which == 0 ? q_scale : 1.0f;
        for (int64_t h = 0; h < H; ++h) {
          const float inv = inv_norm_.data<float>()[r * 2 * H + which * H + h];
          const float* y = plane(which) + r * HK + h * K;  // = n · scale, n the unit vector
          float* dh = d + h * K;
          // n = x·inv, dn = scale·dy: dx = inv·(dn − n (n·dn)).
          const float ndn = dot(y, dh, K);  // n·dn = (y/scale)·(dh·scale)
          for (int64_t j = 0; j < K; ++j) {
            const float n = y[j] / scale;
            dh[j] = inv * (dh[j] * scale - n * ndn);
          }
        }
      }
      float* dc = row + which * HK;  // the conv gradient goes through the pre-conv projection columns below
      for (int64_t j = 0; j < HK; ++j) {
        const float x = c[which * HK + j], s = sigmoid(x);
        dc[j] = d[j] * s * (1.0f + x * (1.0f - s));  // d silu / dx, stored temporarily as d(conv output)
      }
    }
  }
  // dt_bias: Σ_rows dz; A_log[h]: Σ dz·z (bounded: ∂g/∂A_log = z ∂g/∂z) or Σ dg·g (softplus: ∂g/∂A_log = g).
  add_column_sums(dproj + 3 * HK, N, HK, P, dt_bias_->g());
  {
    float* dalog = a_log_->g();
    std::vector<double> sums(size_t(H), 0.0);
    for (int64_t r = 0; r < N; ++r) {
      const float* z_in = proj_.data<float>() + r * P + 3 * HK;
      for (int64_t j = 0; j < HK; ++j) {
        const float contrib = bounded ? dproj[r * P + 3 * HK + j] * (z_in[j] + dt_bias[j])
                                      : dg[r * HK + j] * decay_.data<float>()[r * HK + j];
        sums[size_t(j / K)] += contrib;
      }
    }
    for (int64_t h = 0; h < H; ++h) dalog[h] += float(sums[size_t(h)]);
  }
  // Convs: d(conv output) sits in the q k v columns of dproj; replace it by d(conv input).
  const Conv1dShape conv{HK, config_.kda.conv_kernel, tokens.batch(), tokens.starts.data()};
  Param* weights[3] = {q_conv_, k_conv_, v_conv_};
  float* dconv_in = grad_out_.data<float>();  // free again: [N, HK]
  for (int which = 0; which < 3; ++which) {
    causal_conv1d_backward(conv, proj_.data<float>() + which * HK, P, weights[which]->value.data<float>(),
                           dproj + which * HK, P, dconv_in, HK, weights[which]->g());
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; ++r) std::copy(dconv_in + r * HK, dconv_in + (r + 1) * HK, dproj + r * P + which * HK);
  }
  in_proj_.backward_input(dproj, N, du, p);
  in_proj_.backward_weight(u_, dproj, N, p);
}

}  // namespace hyla
