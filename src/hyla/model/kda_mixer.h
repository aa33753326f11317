#pragma once
// KDA mixer (SPEC §3): fused projections of u, short causal convs, per-head L2 norms, the gates,
// the gated delta rule (kernels/kda.h), per-head output RMSNorm with a sigmoid gate, and the
// output projection. Forward and backward for training; a cached forward for inference.
#include <span>
#include <string>

#include "hyla/kernels/kda.h"
#include "hyla/kernels/kda_gates.h"
#include "hyla/model/config.h"
#include "hyla/model/context.h"
#include "hyla/model/layer_buffer.h"
#include "hyla/model/layer_cache.h"
#include "hyla/model/layers.h"
#include "hyla/model/state_spec.h"

namespace hyla {

class KdaMixer {
 public:
  KdaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config);

  // u: [N, d] (valid until backward when saving) → y: [N, d]. Without caches every sequence
  // starts from a zero state; with one RecurrentState slot per sequence, the new tokens continue
  // it and it is updated in place (no saving for backward then).
  void forward(const float* u, float* y, const ForwardContext& ctx, std::span<LayerCache* const> caches = {});
  // dy → du (overwritten); parameter gradients added.
  void backward(const float* dy, float* du);

  // A sequence's state (SPEC §3): the conv tails [3, kernel−1, H·K] (q, k, v) and the delta-rule
  // state [H, K, V = K], f32 and of fixed size.
  static StateSpec state_spec(const ModelConfig& config);
  int64_t conv_tail_floats() const { return state_spec(config_).conv_tail_floats; }
  int64_t state_floats() const { return state_spec(config_).state_floats; }

 private:
  void forward_cached(const float* u, float* y, const ForwardContext& ctx, std::span<LayerCache* const> caches);
  void project_and_prepare(const float* u, const ForwardContext& ctx, const float* const* conv_tails,
                           LayerActivations& a);
  void output(float* y, const ForwardContext& ctx, bool save, LayerActivations& a);
  float* plane(int which) { return qkv_ + which * rows_ * width_; }
  // This layer's buffers as the pointwise kernels see them (kernels/kda_gates.h).
  KdaPrepareShape prepare_shape() const;
  KdaDecayGate decay_gate() const;
  KdaPrepareInputs prepare_inputs() const;
  KdaPrepared prepared();
  KdaOptions kernel_options(bool backward, Precision p) const;

  const ModelConfig& config_;
  int64_t heads_, head_dim_, width_;  // width_ = H·K
  float gate_lower_bound_;
  // Registered in this order so that [q k v f g b] is one matrix. f and g are the decay and output
  // gates' projections of u: f_proj / g_proj [HK, d], or, with kda.gate_rank / output_gate_rank,
  // f_a_proj / g_a_proj [rank, d] whose outputs f_b_proj / g_b_proj [HK, rank] lift to HK logits.
  Linear q_proj_, k_proj_, v_proj_, f_proj_, g_proj_, b_proj_, f_b_proj_, g_b_proj_, o_proj_;
  Linear in_proj_;  // the fused view
  // Columns of a projection row (proj_, and dproj in backward): in_proj_'s outputs [q k v f g b],
  // then the lifted decay and output gate logits of the low-rank gates. The kernels read q k v,
  // the decay logits (f_col_), the output gate logits (g_col_) and b (b_col_) at this one stride.
  int64_t proj_width_, f_col_, g_col_, b_col_;
  Param *q_conv_, *k_conv_, *v_conv_, *a_log_, *dt_bias_;
  RmsNorm o_norm_;

  // Activations of the last forward (rows × columns): in kept_ when it saved for backward, else
  // in the workspace and gone after the call.
  int64_t rows_ = 0;
  const float* u_ = nullptr;
  float* proj_ = nullptr;      // [N, proj_width_]: q k v (pre-conv), f, g, b, lifted logits (low rank)
  float* conv_ = nullptr;      // [N, 3HK]: conv outputs of q k v, before silu
  float* qkv_ = nullptr;       // three [N, HK] planes q, k, v: silu(conv), q and k L2-normalised (q scaled)
  float* inv_norm_ = nullptr;  // [N, 2H]: 1/sqrt(Σx² + 1e-6) of q and k per head
  float *decay_ = nullptr, *beta_ = nullptr;  // g [N, HK], β [N, H]
  float* o_ = nullptr;         // [N, HV] kernel output
  float* gated_ = nullptr;     // [N, HV] RMSNorm(o) ⊙ σ(gate)
  float* normed_ = nullptr;    // [N, HV] RMSNorm(o)
  float* rstd_ = nullptr;      // [N·H] of the output norm
  Arena kept_;
  KdaSavedStates saved_states_;
  Workspace* workspace_ = nullptr;
  const TokenBatch* tokens_ = nullptr;
  Precision precision_ = Precision::F32;
};

}  // namespace hyla
