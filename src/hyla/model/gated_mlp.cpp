#include "hyla/model/gated_mlp.h"

namespace hyla {

GatedMlp::GatedMlp(ParamStore& store, const std::string& prefix, int64_t in, int64_t hidden, Component component)
    : gate_proj(store, prefix + "gate_proj", in, hidden, component),
      up_proj(store, prefix + "up_proj", in, hidden, component),
      down_proj(store, prefix + "down_proj", hidden, in, component, Init::NormalOutput),
      gate_up(Linear::fuse({&gate_proj, &up_proj})) {
  // A routed expert's three matrices run in one quantised kernel (moe_experts.h).
  if (component == Component::RoutedExperts) store.get(up_proj.param().name).stored_like_next = true;
}

GatedActivation gated_activation(Activation kind, const MoeConfig& moe, double swiglu_limit) {
  return {kind == Activation::Situ ? GatedActivation::Kind::Situ : GatedActivation::Kind::Swiglu, float(moe.situ_beta),
          float(moe.situ_linear_beta), float(swiglu_limit)};
}

DenseGatedMlp::DenseGatedMlp(const GatedMlp& mlp, GatedActivation activation)
    : gate_up_(mlp.gate_up), down_(mlp.down_proj), activation_(activation) {}

void DenseGatedMlp::forward(const float* x, int64_t n, float* y, Precision precision, bool save, Workspace& workspace,
                            float beta) {
  const int64_t w = down_.in();
  LayerActivations activations(kept_, workspace, save);
  float* gu = activations.take<float>(n * 2 * w);
  float* h = activations.take<float>(n * w);
  if (save) saved_x_ = x, saved_gu_ = gu, saved_h_ = h, saved_rows_ = n, saved_precision_ = precision, workspace_ = &workspace;
  gate_up_.forward(x, n, gu, precision);
  gated_activation_forward(activation_, gu, n, w, h);
  down_.forward(h, n, y, precision, beta);
}

void DenseGatedMlp::backward(const float* dy, float* dx, float beta) {
  HYLA_ASSERT(saved_x_ != nullptr);
  const int64_t n = saved_rows_, w = down_.in();
  const Precision p = saved_precision_;
  Frame scratch(workspace_->serial());
  float* dh = scratch.take<float>(n * w);
  float* dgu = scratch.take<float>(n * 2 * w);
  down_.backward_input(dy, n, dh, p);
  down_.backward_weight(saved_h_, dy, n, p);
  gated_activation_backward(activation_, saved_gu_, dh, n, w, dgu);
  gate_up_.backward_input(dgu, n, dx, p, beta);
  gate_up_.backward_weight(saved_x_, dgu, n, p);
}

}  // namespace hyla
