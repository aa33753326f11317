#include "hyla/model/kda_mixer.h"

#include <utility>

#include "hyla/kernels/conv1d.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/norm.h"

namespace hyla {

StateSpec KdaMixer::state_spec(const ModelConfig& config) {
  const int64_t H = config.kda.num_heads, K = config.kda.head_dim;
  return {.conv_tail_floats = 3 * (config.kda.conv_kernel - 1) * H * K, .state_floats = H * K * K};
}

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
  const int64_t f_rank = config.kda.gate_rank, g_rank = config.kda.output_gate_rank;
  f_proj_ = f_rank ? Linear(store, prefix + "f_a_proj", d, f_rank, c) : Linear(store, prefix + "f_proj", d, HK, c);
  g_proj_ = g_rank ? Linear(store, prefix + "g_a_proj", d, g_rank, c) : Linear(store, prefix + "g_proj", d, HK, c);
  b_proj_ = Linear(store, prefix + "b_proj", d, heads_, c);
  in_proj_ = Linear::fuse({&q_proj_, &k_proj_, &v_proj_, &f_proj_, &g_proj_, &b_proj_});
  if (f_rank) f_b_proj_ = Linear(store, prefix + "f_b_proj", f_rank, HK, c);
  if (g_rank) g_b_proj_ = Linear(store, prefix + "g_b_proj", g_rank, HK, c);
  const int64_t f_first = 3 * HK, g_first = f_first + f_proj_.out();
  b_col_ = g_first + g_proj_.out();
  proj_width_ = in_proj_.out();
  f_col_ = f_rank ? std::exchange(proj_width_, proj_width_ + HK) : f_first;
  g_col_ = g_rank ? std::exchange(proj_width_, proj_width_ + HK) : g_first;
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

KdaPrepareShape KdaMixer::prepare_shape() const { return {rows_, heads_, head_dim_, proj_width_}; }

KdaDecayGate KdaMixer::decay_gate() const {
  return {config_.kda.gate == KdaGate::LowerBound, gate_lower_bound_, a_log_->value.data<float>(),
          dt_bias_->value.data<float>()};
}

KdaPrepareInputs KdaMixer::prepare_inputs() const { return {conv_, proj_ + f_col_, proj_ + b_col_}; }

KdaPrepared KdaMixer::prepared() {
  return {plane(0), plane(1), plane(2), inv_norm_, decay_, beta_};
}

// Projections, convs (continuing from `conv_tails` when given: three [kernel-1, HK] tails per
// sequence, q k v), activations, L2 norms, decays and β for the rows of ctx.tokens.
void KdaMixer::project_and_prepare(const float* u, const ForwardContext& ctx, const float* const* conv_tails,
                                   LayerActivations& a) {
  const int64_t N = ctx.tokens.rows, HK = width_, H = heads_, P = proj_width_;
  rows_ = N;
  u_ = u;
  proj_ = a.take<float>(N * P);
  conv_ = a.take<float>(N * 3 * HK);
  qkv_ = a.take<float>(N * 3 * HK);
  inv_norm_ = a.take<float>(N * 2 * H);
  decay_ = a.take<float>(N * HK);
  beta_ = a.take<float>(N * H);
  in_proj_.forward(u, N, proj_, ctx.precision, 0.0f, -1, P);
  if (f_b_proj_.defined()) f_b_proj_.forward(proj_ + 3 * HK, N, proj_ + f_col_, ctx.precision, 0.0f, P, P);
  if (g_b_proj_.defined()) g_b_proj_.forward(proj_ + 3 * HK + f_proj_.out(), N, proj_ + g_col_, ctx.precision, 0.0f, P, P);

  const Conv1dShape conv{HK, config_.kda.conv_kernel, ctx.tokens.batch(), ctx.tokens.starts.data()};
  const Param* weights[3] = {q_conv_, k_conv_, v_conv_};
  std::vector<const float*> tails(static_cast<size_t>(ctx.tokens.batch()));
  for (int which = 0; which < 3; ++which) {
    for (int64_t b = 0; b < ctx.tokens.batch(); ++b)
      tails[size_t(b)] = conv_tails ? conv_tails[b] + which * (conv.kernel - 1) * HK : nullptr;
    causal_conv1d_forward(conv, proj_ + which * HK, P, weights[which]->value.data<float>(),
                          conv_tails ? tails.data() : nullptr, conv_ + which * HK, 3 * HK, ctx.workspace);
  }
  kda_prepare_forward(prepare_shape(), decay_gate(), prepare_inputs(), prepared());
}

// y = o_proj(RMSNorm(o) per head ⊙ σ(gate)).
void KdaMixer::output(float* y, const ForwardContext& ctx, bool save, LayerActivations& a) {
  const int64_t N = rows_, HK = width_, H = heads_, K = head_dim_, P = proj_width_;
  normed_ = a.take<float>(N * HK);
  gated_ = a.take<float>(N * HK);
  rstd_ = a.take<float>(N * H);
  rmsnorm_forward(o_, K, o_norm_.weight().value.data<float>(), N * H, K, float(config_.rms_norm_eps),
                  normed_, K, save ? rstd_ : nullptr);
  kda_output_gate_forward(normed_, proj_ + g_col_, P, N, HK, gated_);
  o_proj_.forward(gated_, N, y, ctx.precision);
}

void KdaMixer::forward(const float* u, float* y, const ForwardContext& ctx, std::span<LayerCache* const> caches) {
  if (!caches.empty()) return forward_cached(u, y, ctx, caches);
  LayerActivations a(kept_, ctx.workspace, ctx.save_for_backward);
  project_and_prepare(u, ctx, nullptr, a);
  o_ = a.take<float>(rows_ * width_);
  const KdaInputs in{ctx.tokens.batch(), ctx.tokens.starts.data(), plane(0), plane(1), plane(2),
                     decay_, beta_, nullptr};
  kda_forward({heads_, head_dim_, head_dim_}, in, kernel_options(ctx.save_for_backward, ctx.precision),
              o_, nullptr, ctx.save_for_backward ? &saved_states_ : nullptr, ctx.workspace);
  output(y, ctx, ctx.save_for_backward, a);
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
  LayerActivations a(kept_, ctx.workspace, /*keep=*/false);
  project_and_prepare(u, ctx, tails.data(), a);
  const Conv1dShape conv{width_, config_.kda.conv_kernel, B, ctx.tokens.starts.data()};
  std::vector<float*> tail(static_cast<size_t>(B));
  for (int which = 0; which < 3; ++which) {
    for (int64_t b = 0; b < B; ++b) tail[size_t(b)] = tails[size_t(b)] + which * (conv.kernel - 1) * width_;
    causal_conv1d_update_tails(conv, proj_ + which * width_, proj_width_, tail.data(), ctx.workspace);
  }
  o_ = a.take<float>(rows_ * width_);
  const KdaShape shape{heads_, head_dim_, head_dim_};
  bool decode = true;
  for (int64_t b = 0; b < B; ++b) decode &= ctx.tokens.length(b) == 1;
  if (decode) {
    kda_decode_step(shape, B, plane(0), plane(1), plane(2), decay_, beta_, states.data(),
                    o_);
  } else {
    const KdaInputs in{B, ctx.tokens.starts.data(), plane(0), plane(1), plane(2), decay_,
                       beta_, states.data()};
    kda_forward(shape, in, kernel_options(false, ctx.precision), o_, states.data(), nullptr, ctx.workspace);
  }
  output(y, ctx, false, a);
}

void KdaMixer::backward(const float* dy, float* du) {
  HYLA_ASSERT(tokens_ && u_);
  const TokenBatch& tokens = *tokens_;
  const int64_t N = rows_, HK = width_, H = heads_, K = head_dim_, P = proj_width_;
  const Precision p = precision_;
  Frame scratch(workspace_->serial());
  float* dproj = scratch.take<float>(N * P);
  float* dgated = scratch.take<float>(N * HK);

  // y = o_proj(gated), gated = normed ⊙ σ(gate).
  o_proj_.backward_input(dy, N, dgated, p);
  o_proj_.backward_weight(gated_, dy, N, p);
  kda_output_gate_backward(normed_, proj_ + g_col_, P, N, HK, dgated, dgated,
                           dproj + g_col_);  // dgated now holds d(normed)
  // normed = RMSNorm_{o_norm}(o) per head: do overwrites dgated in place.
  rmsnorm_backward(o_, K, o_norm_.weight().value.data<float>(), rstd_, dgated, K, N * H,
                   K, dgated, K, /*accumulate_dx=*/false, o_norm_.weight().g(), *workspace_);

  // The delta rule.
  float* dq = scratch.take<float>(4 * N * HK);
  float* dk = dq + N * HK;
  float* dv = dk + N * HK;
  float* dg = dv + N * HK;
  float* dbeta = scratch.take<float>(N * H);
  const KdaInputs in{tokens.batch(), tokens.starts.data(), plane(0), plane(1), plane(2), decay_,
                     beta_, nullptr};
  kda_backward({heads_, head_dim_, head_dim_}, in, kernel_options(true, p), dgated, nullptr, saved_states_,
               {dq, dk, dv, dg, dbeta, nullptr}, *workspace_);

  // The activations, L2 norms and gates: d(conv output) into the q k v columns of dproj.
  kda_prepare_backward(prepare_shape(), decay_gate(), prepare_inputs(), prepared(), {dq, dk, dv, dg, dbeta},
                       {dproj, dproj + f_col_, dproj + b_col_, a_log_->g(), dt_bias_->g()});
  // Convs: d(conv output) sits in the q k v columns of dproj; replace it by d(conv input).
  const Conv1dShape conv{HK, config_.kda.conv_kernel, tokens.batch(), tokens.starts.data()};
  Param* weights[3] = {q_conv_, k_conv_, v_conv_};
  float* dconv_in = dgated;  // free again: [N, HK]
  for (int which = 0; which < 3; ++which) {
    causal_conv1d_backward(conv, proj_ + which * HK, P, weights[which]->value.data<float>(),
                           dproj + which * HK, P, dconv_in, HK, weights[which]->g(), *workspace_);
    copy_heads(dconv_in, {HK, 0}, N, 1, HK, dproj + which * HK, {P, 0});
  }
  // Low-rank gates: the lifted logits' gradients back through f_b / g_b into the f_a / g_a columns.
  const int64_t f_first = 3 * HK, g_first = f_first + f_proj_.out();
  if (f_b_proj_.defined()) {
    f_b_proj_.backward_weight(proj_ + f_first, dproj + f_col_, N, p, P, P);
    f_b_proj_.backward_input(dproj + f_col_, N, dproj + f_first, p, 0.0f, P, P);
  }
  if (g_b_proj_.defined()) {
    g_b_proj_.backward_weight(proj_ + g_first, dproj + g_col_, N, p, P, P);
    g_b_proj_.backward_input(dproj + g_col_, N, dproj + g_first, p, 0.0f, P, P);
  }
  in_proj_.backward_input(dproj, N, du, p, 0.0f, P);
  in_proj_.backward_weight(u_, dproj, N, p, -1, P);
}

}  // namespace hyla
