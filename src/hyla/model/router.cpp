#include "hyla/model/router.h"

#include "hyla/core/error.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/matmul.h"
#include "hyla/kernels/moe.h"

namespace hyla {

Router::Router(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : experts_(config.moe.num_experts),
      k_(config.moe.num_experts_per_tok),
      latent_(config.moe.router_latent_dim),
      scaling_(float(config.moe.routed_scaling_factor)) {
  const int64_t d = config.hidden_size;
  if (latent_ == 0) {
    weight_ = Linear(store, prefix + "gate", d, experts_, Component::Router, Init::Normal, WeightStorage::FloatOnly);
  } else {
    proj_ = Linear(store, prefix + "gate.proj", d, latent_, Component::Router, Init::Normal, WeightStorage::FloatOnly);
    centres_ = &store.add(prefix + "gate.centres", {experts_, latent_}, Init::Normal, Component::Router,
                          /*weight_decay=*/false);
  }
  bias_ = &store.add(prefix + "gate.e_score_correction_bias", {experts_}, Init::Zeros, Component::Router,
                     /*weight_decay=*/false, /*trainable=*/false);
}

Routing Router::route(const float* u, int64_t n, LayerActivations& activations) const {
  Routing routing{n, experts_, k_};
  routing.scores = activations.take<float>(n * experts_);
  routing.selected = activations.take<int32_t>(n * k_);
  routing.weights = activations.take<float>(n * k_);
  if (latent_ > 0) routing.latent = activations.take<float>(n * latent_);
  route_into(u, routing);
  return routing;
}

void Router::route_into(const float* u, Routing& routing) const {
  HYLA_ASSERT(routing.experts == experts_ && routing.k == k_ && (latent_ == 0 || routing.latent));
  const int64_t n = routing.tokens;
  float* scores = routing.scores;
  if (latent_ == 0) {
    weight_.forward(u, n, scores, Precision::F32);
  } else {
    proj_.forward(u, n, routing.latent, Precision::F32);
    gemm(Trans::N, Trans::T, n, experts_, latent_, 1.0f, routing.latent, latent_, centres_->v(), latent_, 0.0f, scores,
         experts_);
  }
  sigmoid_rows(scores, n, experts_, experts_);
  select_experts(scores, bias_->v(), n, experts_, k_, scaling_, routing.selected, routing.weights);
}

void Router::backward(const float* u, const Routing& routing, float* d_scores, float* du, Arena& scratch) {
  const int64_t n = routing.tokens;
  const float* s = routing.s();
  sigmoid_rows_backward(s, experts_, n, experts_, d_scores, experts_);
  if (latent_ == 0) {
    weight_.backward_weight(u, d_scores, n, Precision::F32);
    weight_.backward_input(d_scores, n, du, Precision::F32, 1.0f);
    return;
  }
  const float* h = routing.latent;
  Frame frame(scratch);
  float* dh = frame.take<float>(n * latent_);
  gemm(Trans::T, Trans::N, experts_, latent_, n, 1.0f, d_scores, experts_, h, latent_, 1.0f, centres_->g(), latent_);
  gemm(Trans::N, Trans::N, n, latent_, experts_, 1.0f, d_scores, experts_, centres_->v(), latent_, 0.0f, dh, latent_);
  proj_.backward_weight(u, dh, n, Precision::F32);
  proj_.backward_input(dh, n, du, Precision::F32, 1.0f);
}

}  // namespace hyla
