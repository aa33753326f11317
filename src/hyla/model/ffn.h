#pragma once
// Feed-forward sublayers (SPEC §5): the dense SwiGLU FFN and the MoE FFN with its router,
// routed experts, shared experts and optional latent projection.
//
// MoE forward stages (moe_dispatch.h): route (router.h) → dispatch → expert compute over an expert
// range (moe_experts.h) → combine; the shared experts run on all tokens beside them.
#include <string>
#include <vector>

#include "hyla/model/balancing.h"
#include "hyla/model/collective.h"
#include "hyla/model/expert_exchange.h"
#include "hyla/model/expert_offload.h"
#include "hyla/model/gated_mlp.h"
#include "hyla/model/layers.h"
#include "hyla/model/moe_dispatch.h"
#include "hyla/model/moe_experts.h"
#include "hyla/model/router.h"

namespace hyla {

class DenseFfn {
 public:
  DenseFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config);
  // y = W_down(act(W_gate u, W_up u)), act = moe.dense_activation; u and y [N, d]; u must stay valid
  // until backward when saving.
  void forward(const float* u, float* y, const ForwardContext& ctx);
  // du = dL/du (overwritten); adds the parameter gradients.
  void backward(const float* dy, float* du);

 private:
  GatedMlp mlp_;
  DenseGatedMlp dense_;
};

class MoeFfn {
 public:
  using LoadStats = ExpertLoadStats;

  MoeFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config);

  // u and y [N, d]; u must stay valid until backward when saving.
  void forward(const float* u, float* y, const ForwardContext& ctx);
  // du = dL/du (overwritten; includes the aux_loss term's gradient, scaled by the forward's
  // loss_scale); adds the parameter gradients. The balancing bias has none.
  void backward(const float* dy, float* du);
  // The aux_loss term of the last forward (0 unless balancing is aux_loss).
  float aux_loss() const { return aux_loss_; }
  // Once after each optimiser step, update_balancing (below) moves the balancing bias by the
  // configured rule from the routing of every saving forward since the last call; it routes from
  // the next forward on.
  friend void update_balancing(std::span<MoeFfn* const> layers, Collective& collective);
  // Where the routed experts run (default: all on this process).
  void set_exchange(ExpertExchange& exchange) { exchange_ = &exchange; }
  // Where the routed experts' weights come from: their parameters (default), or the slots of
  // `offload`, whose MoE layer `index` this is (expert_offload.h).
  void set_offload(ExpertOffload* offload, int index) { offload_ = offload, offload_index_ = index; }
  // Drops the routing recorded since the last update without moving the bias (a skipped step).
  void discard_routing() { balancer_.discard(); }
  // Loads of the saving forwards since the last update_balancing, or of the last forward if none.
  LoadStats load_stats() const { return balancer_.stats(); }

  const Router& router() const { return router_; }
  // The routed experts this process holds, for an exchange that runs another process's slot rows
  // on them (expert_exchange.h).
  RoutedExperts& routed_experts() { return experts_; }

 private:
  // Everything a forward leaves for backward (its arrays in kept_); non-saving forwards use a
  // second set, so an evaluation between a forward and its backward leaves the saved one intact.
  struct ForwardState {
    Routing routing;
    ExpertDispatch dispatch;
    ExpertActivations experts;
    const float* x_latent = nullptr;  // [N, ℓ] expert input W_lat_down u (ℓ > 0)
    const float* m_norm = nullptr;    // [N, ℓ] lat_up's input: RMSNorm_{lat_norm}(m), or m (ℓ > 0)
  };

  // The shared experts read u at width d and add to y after lat_up (moe.shared_full_width with a
  // latent); else they read the experts' input x_e and add to m.
  bool shared_after_up() const {
    return config_.moe.num_shared_experts > 0 && config_.moe.shared_full_width && config_.moe.latent_dim > 0;
  }

  const ModelConfig& config_;
  Router router_;
  Linear lat_down_, lat_up_;
  RmsNorm lat_norm_;
  RoutedExperts experts_;
  GatedMlp shared_;
  DenseGatedMlp shared_mlp_;
  LoadBalancer balancer_;
  ExpertExchange* exchange_ = &local_experts();
  ExpertOffload* offload_ = nullptr;
  int offload_index_ = 0;

  ForwardState saved_, work_;
  const float* saved_u_ = nullptr;
  Precision saved_precision_ = Precision::F32;
  float saved_loss_scale_ = 1.0f;
  Workspace* workspace_ = nullptr;  // the saving forward's, for the backward's scratch
  float aux_loss_ = 0.0f;
  Arena kept_;
};

// Moves every layer's balancing bias from the step's routing on every process of `collective`:
// all the layers' counts (balancing.h) in one sum.
void update_balancing(std::span<MoeFfn* const> layers, Collective& collective);

}  // namespace hyla
