#include "hyla/model/ffn.h"

#include "hyla/kernels/moe.h"

namespace hyla {

DenseFfn::DenseFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : mlp_(store, prefix, config.hidden_size, config.moe.intermediate_size, Component::DenseFfn),
      dense_(mlp_, gated_activation(config.moe.dense_activation, config.moe)) {}

void DenseFfn::forward(const float* u, float* y, const ForwardContext& ctx) {
  dense_.forward(u, ctx.tokens.rows, y, ctx.precision, ctx.save_for_backward, ctx.workspace);
}

void DenseFfn::backward(const float* dy, float* du) { dense_.backward(dy, du); }

MoeFfn::MoeFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : config_(config), router_(store, prefix, config), balancer_(config.moe) {
  const MoeConfig& m = config.moe;
  const int64_t d = config.hidden_size, width = m.latent_dim > 0 ? m.latent_dim : d;
  if (m.latent_dim > 0) {
    lat_down_ = Linear(store, prefix + "lat_down", d, m.latent_dim, Component::MoeLatent);
    if (m.latent_norm)
      lat_norm_ = RmsNorm(store, prefix + "lat_norm", m.latent_dim, Component::MoeLatent, float(config.rms_norm_eps));
    lat_up_ = Linear(store, prefix + "lat_up", m.latent_dim, d, Component::MoeLatent, Init::NormalOutput);
  }
  experts_ = RoutedExperts(store, prefix, config, width);
  if (m.num_shared_experts > 0) {
    shared_ = GatedMlp(store, prefix + "shared_experts.", shared_after_up() ? d : width,
                       m.shared_width(), Component::SharedExperts);
    shared_mlp_ = DenseGatedMlp(shared_, gated_activation(m.shared_activation, config.moe, m.shared_swiglu_limit));
  }
}

void MoeFfn::forward(const float* u, float* y, const ForwardContext& ctx) {
  const MoeConfig& m = config_.moe;
  const int64_t n = ctx.tokens.rows, k = m.num_experts_per_tok, latent = m.latent_dim;
  const int64_t width = latent > 0 ? latent : config_.hidden_size, w = m.moe_intermediate_size;
  const bool save = ctx.save_for_backward, shared = m.num_shared_experts > 0 && !shared_after_up();
  ForwardState& state = save ? saved_ : work_;
  LayerActivations activations(kept_, ctx.workspace, save);

  state.routing = router_.route(u, n, activations);
  if (offload_) offload_->predict_next(offload_index_, u, n, ctx.workspace.serial());
  balancer_.record(state.routing, router_.bias().v(), save);
  state.dispatch.build(state.routing);
  aux_loss_ = m.balancing == Balancing::AuxLoss
                  ? aux_loss_value(state.routing, state.dispatch.load.data(), float(m.aux_loss_coef))
                  : 0.0f;
  state.experts = save ? ExpertActivations{activations.take<float>(n * k * 2 * w), activations.take<float>(n * k * w)}
                       : ExpertActivations{};

  const float* x = u;  // the experts' input x_e
  float* combined = y;  // m
  if (latent > 0) {
    float* x_latent = activations.take<float>(n * latent);
    lat_down_.forward(u, n, x_latent, ctx.precision);
    state.x_latent = x = x_latent;
    combined = activations.take<float>(n * latent);
  }
  if (shared) shared_mlp_.forward(x, n, combined, ctx.precision, save, ctx.workspace);
  Frame scratch(ctx.workspace.serial());
  float* slot_out = scratch.take<float>(n * k * width);
  exchange_->forward(state.dispatch, x, width, slot_out, [&](int64_t first, int64_t last) {
    if (!offload_) {
      experts_.forward(x, state.dispatch, first, last, ctx.precision, state.experts, slot_out, ctx.workspace);
      return;
    }
    offload_->run(offload_index_, state.dispatch, first, last,
                  [&](int64_t group_first, int64_t group_last, std::span<const PackedExpertWeights> weights) {
                    experts_.forward(x, state.dispatch, group_first, group_last, ctx.precision, state.experts,
                                     slot_out, ctx.workspace, weights);
                  });
  }, ExpertExchange::Held{experts_, ctx.precision, save, ctx.workspace});
  combine_slots(state.dispatch, slot_out, width, /*weighted=*/true, /*accumulate=*/shared, combined);
  if (latent > 0) {
    float* normed = combined;
    if (m.latent_norm) {
      normed = activations.take<float>(n * latent);
      lat_norm_.forward(combined, n, normed, save);
    }
    lat_up_.forward(normed, n, y, ctx.precision);
    state.m_norm = normed;
  }
  if (shared_after_up()) shared_mlp_.forward(u, n, y, ctx.precision, save, ctx.workspace, /*beta=*/1.0f);
  if (save) saved_u_ = u, saved_precision_ = ctx.precision, saved_loss_scale_ = ctx.loss_scale, workspace_ = &ctx.workspace;
}

void MoeFfn::backward(const float* dy, float* du) {
  HYLA_ASSERT(saved_u_ != nullptr);
  const MoeConfig& m = config_.moe;
  const ForwardState& state = saved_;
  const int64_t n = state.routing.tokens, k = m.num_experts_per_tok, latent = m.latent_dim;
  const int64_t width = latent > 0 ? latent : config_.hidden_size;
  const Precision p = saved_precision_;
  const bool shared = m.num_shared_experts > 0 && !shared_after_up();
  Frame scratch(workspace_->serial());

  const float* dm = dy;     // dL/dm
  const float* x = saved_u_;  // x_e
  float* dx = du;           // dL/dx_e
  if (latent > 0) {
    float* d_normed = scratch.take<float>(n * latent);
    lat_up_.backward_input(dy, n, d_normed, p);
    lat_up_.backward_weight(state.m_norm, dy, n, p);
    dm = d_normed;
    if (m.latent_norm) {
      float* d_combined = scratch.take<float>(n * latent);
      lat_norm_.backward(d_normed, d_combined, /*accumulate=*/false, *workspace_);
      dm = d_combined;
    }
    x = state.x_latent;
    dx = scratch.take<float>(n * latent);
  }
  if (shared) shared_mlp_.backward(dm, dx);
  float* d_slot_in = scratch.take<float>(n * k * width);
  float* d_slot_weight = scratch.take<float>(n * k);
  exchange_->backward(
      state.dispatch, dm, width, d_slot_in, d_slot_weight,
      [&](int64_t first, int64_t last) {
        experts_.backward(x, dm, state.dispatch, first, last, state.experts, p, d_slot_in, d_slot_weight, *workspace_);
      },
      ExpertExchange::Held{experts_, p, true, *workspace_});
  combine_slots(state.dispatch, d_slot_in, width, /*weighted=*/false, /*accumulate=*/shared, dx);
  if (latent > 0) {
    lat_down_.backward_input(dx, n, du, p);
    lat_down_.backward_weight(saved_u_, dx, n, p);
  }
  if (shared_after_up()) shared_mlp_.backward(dy, du, /*beta=*/1.0f);

  // The router: through the routing weights' normalisation (and the aux_loss term) into s.
  float* d_weights = scratch.take<float>(n * k);
  for (int64_t i = 0; i < n * k; ++i) d_weights[i] = d_slot_weight[state.dispatch.token_slot[size_t(i)]];
  float* d_scores = scratch.take<float>(n * m.num_experts);
  const Routing& r = state.routing;
  routing_weights_backward(r.scores, r.selected, r.weights, r.tokens, r.experts, r.k, float(m.routed_scaling_factor),
                           d_weights, d_scores);
  if (m.balancing == Balancing::AuxLoss)
    aux_loss_backward(state.routing, state.dispatch.load.data(), float(m.aux_loss_coef), saved_loss_scale_, d_scores);
  router_.backward(saved_u_, state.routing, d_scores, du, workspace_->serial());
}

void update_balancing(std::span<MoeFfn* const> layers, Collective& collective) {
  const bool histograms = collective.size() > 1;
  int64_t size = 0;
  for (const MoeFfn* layer : layers) size += layer->balancer_.counts_size(histograms);
  std::vector<int64_t> counts(static_cast<size_t>(size));  // once per step; up to E·1024 values per layer
  int64_t at = 0;
  for (MoeFfn* layer : layers) {
    layer->balancer_.export_counts(layer->router_.bias().v(), histograms, counts.data() + at);
    at += layer->balancer_.counts_size(histograms);
  }
  collective.sum(std::span<int64_t>(counts));
  at = 0;
  for (MoeFfn* layer : layers) {
    layer->balancer_.update(layer->router_.bias().v(), counts.data() + at, histograms);
    at += layer->balancer_.counts_size(histograms);
  }
}

}  // namespace hyla
