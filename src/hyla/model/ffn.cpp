#include "hyla/model/ffn.h"

#include "hyla/model/layer_buffer.h"

namespace hyla {

DenseFfn::DenseFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : mlp_(store, prefix, config.hidden_size, config.moe.intermediate_size, Component::DenseFfn), dense_(mlp_) {}

void DenseFfn::forward(const float* u, float* y, const ForwardContext& ctx) {
  dense_.forward(u, ctx.tokens.rows, y, ctx.precision, ctx.save_for_backward);
}

void DenseFfn::backward(const float* dy, float* du) { dense_.backward(dy, du); }

MoeFfn::MoeFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : config_(config), router_(store, prefix, config), balancer_(config.moe) {
  const MoeConfig& m = config.moe;
  const int64_t d = config.hidden_size, width = m.latent_dim > 0 ? m.latent_dim : d;
  if (m.latent_dim > 0) {
    lat_down_ = Linear(store, prefix + "lat_down", d, m.latent_dim, Component::MoeLatent);
    lat_norm_ = RmsNorm(store, prefix + "lat_norm", m.latent_dim, Component::MoeLatent, float(config.rms_norm_eps));
    lat_up_ = Linear(store, prefix + "lat_up", m.latent_dim, d, Component::MoeLatent, Init::NormalOutput);
  }
  experts_ = RoutedExperts(store, prefix, config, width);
  if (m.num_shared_experts > 0) {
    shared_ = GatedMlp(store, prefix + "shared_experts.", width, m.num_shared_experts * m.moe_intermediate_size,
                       Component::SharedExperts);
    shared_mlp_ = DenseGatedMlp(shared_);
  }
}

void MoeFfn::forward(const float* u, float* y, const ForwardContext& ctx) {
  const MoeConfig& m = config_.moe;
  const int64_t n = ctx.tokens.rows, latent = m.latent_dim, width = latent > 0 ? latent : config_.hidden_size;
  const bool save = ctx.save_for_backward, shared = m.num_shared_experts > 0;
  ForwardState& state = save ? saved_ : work_;

  router_.route(u, n, state.routing);
  balancer_.record(state.routing, router_.bias().v(), save);
  state.dispatch.build(state.routing);
  aux_loss_ = m.balancing == Balancing::AuxLoss
                  ? aux_loss_value(state.routing, state.dispatch.load.data(), float(m.aux_loss_coef))
                  : 0.0f;

  const float* x = u;  // the experts' input x_e
  float* combined = y;  // m
  if (latent > 0) {
    float* x_latent = grow_buffer<float>(state.x_latent, n * latent);
    lat_down_.forward(u, n, x_latent, ctx.precision);
    x = x_latent;
    combined = grow_buffer<float>(state.m, n * latent);
  }
  if (shared) shared_mlp_.forward(x, n, combined, ctx.precision, save);
  float* slot_out = grow_buffer<float>(slot_rows_, n * m.num_experts_per_tok * width);
  exchange_->forward(state.dispatch, x, width, slot_out, [&](int64_t first, int64_t last) {
    experts_.forward(x, state.dispatch, first, last, ctx.precision, save, slot_out);
  });
  combine_slots(state.dispatch, slot_out, width, /*weighted=*/true, /*accumulate=*/shared, combined);
  if (latent > 0) {
    float* normed = grow_buffer<float>(state.m_norm, n * latent);
    lat_norm_.forward(combined, n, normed, save);
    lat_up_.forward(normed, n, y, ctx.precision);
  }
  if (save) saved_u_ = u, saved_precision_ = ctx.precision, saved_loss_scale_ = ctx.loss_scale;
}

void MoeFfn::backward(const float* dy, float* du) {
  HYLA_ASSERT(saved_u_ != nullptr);
  const MoeConfig& m = config_.moe;
  const ForwardState& state = saved_;
  const int64_t n = state.routing.tokens, k = m.num_experts_per_tok, latent = m.latent_dim;
  const int64_t width = latent > 0 ? latent : config_.hidden_size;
  const Precision p = saved_precision_;
  const bool shared = m.num_shared_experts > 0;

  const float* dm = dy;     // dL/dm
  const float* x = saved_u_;  // x_e
  float* dx = du;           // dL/dx_e
  if (latent > 0) {
    float* d_normed = grow_buffer<float>(d_m_norm_, n * latent);
    lat_up_.backward_input(dy, n, d_normed, p);
    lat_up_.backward_weight(state.m_norm.data<float>(), dy, n, p);
    float* d_combined = grow_buffer<float>(d_m_, n * latent);
    lat_norm_.backward(d_normed, d_combined, /*accumulate=*/false);
    dm = d_combined;
    x = state.x_latent.data<float>();
    dx = grow_buffer<float>(d_x_latent_, n * latent);
  }
  if (shared) shared_mlp_.backward(dm, dx);
  float* d_slot_in = grow_buffer<float>(slot_rows_, n * k * width);
  float* d_slot_weight = grow_buffer<float>(d_slot_weight_, n * k);
  exchange_->backward(state.dispatch, dm, width, d_slot_in, d_slot_weight, [&](int64_t first, int64_t last) {
    experts_.backward(x, dm, state.dispatch, first, last, d_slot_in, d_slot_weight);
  });
  combine_slots(state.dispatch, d_slot_in, width, /*weighted=*/false, /*accumulate=*/shared, dx);
  if (latent > 0) {
    lat_down_.backward_input(dx, n, du, p);
    lat_down_.backward_weight(saved_u_, dx, n, p);
  }

  // The router: through the routing weights' normalisation (and the aux_loss term) into s.
  float* d_weights = grow_buffer<float>(d_weights_, n * k);
  for (int64_t i = 0; i < n * k; ++i) d_weights[i] = d_slot_weight[state.dispatch.token_slot[size_t(i)]];
  float* d_scores = grow_buffer<float>(d_scores_, n * m.num_experts);
  routing_weights_backward(state.routing, float(m.routed_scaling_factor), d_weights, d_scores);
  if (m.balancing == Balancing::AuxLoss)
    aux_loss_backward(state.routing, state.dispatch.load.data(), float(m.aux_loss_coef), saved_loss_scale_, d_scores);
  router_.backward(saved_u_, state.routing, d_scores, du);
}

void MoeFfn::update_balancing(Collective& collective) { balancer_.update(router_.bias().v(), collective); }

}  // namespace hyla
