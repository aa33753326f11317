#pragma once
// The gated MLP of the FFN sublayers (SPEC §5): its parameters, and its application to every row
// (the dense FFN and the shared experts; the routed experts run per expert in moe_experts.h).
#include <string>

#include "hyla/kernels/activations.h"
#include "hyla/model/config.h"
#include "hyla/model/layer_buffer.h"
#include "hyla/model/layers.h"

namespace hyla {

// W_down(act(W_gate x, W_up x)); gate and up are registered together so [gate; up] is one matrix.
struct GatedMlp {
  Linear gate_proj, up_proj, down_proj;
  Linear gate_up;  // the fused view [gate; up]
  GatedMlp() = default;
  GatedMlp(ParamStore& store, const std::string& prefix, int64_t in, int64_t hidden, Component component);
};

// The gate the config names, with its SiTU constants (moe.situ_beta, moe.situ_linear_beta).
GatedActivation gated_activation(Activation kind, const MoeConfig& moe, double swiglu_limit = 0.0);

// A GatedMlp applied to every row (the dense FFN, the shared experts): [gate; up] x as one GEMM,
// the activation, then down.
class DenseGatedMlp {
 public:
  DenseGatedMlp() = default;
  DenseGatedMlp(const GatedMlp& mlp, GatedActivation activation);
  // y = W_down(act(W_gate x, W_up x)) + beta·y for n rows; when saving, x must stay valid until
  // backward, and so must `workspace`, whose scratch the backward uses.
  void forward(const float* x, int64_t n, float* y, Precision precision, bool save, Workspace& workspace,
               float beta = 0.0f);
  // dx = dL/dx + beta·dx from dy; adds the parameter gradients.
  void backward(const float* dy, float* dx, float beta = 0.0f);

 private:
  Linear gate_up_, down_;
  GatedActivation activation_;
  // The last saving forward's input, pre-activations [n, 2w] and activations [n, w] (in kept_).
  const float* saved_x_ = nullptr;
  const float *saved_gu_ = nullptr, *saved_h_ = nullptr;
  int64_t saved_rows_ = 0;
  Precision saved_precision_ = Precision::F32;
  Workspace* workspace_ = nullptr;
  Arena kept_;
};

}  // namespace hyla
