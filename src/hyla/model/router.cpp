#include "hyla/model/router.h"

#include <cstring>

#include "hyla/core/error.h"
#include "hyla/core/team.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/matmul.h"

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
  parallel_rows(n, experts_, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) sigmoid_inplace(scores + t * experts_, experts_);
  });
  select_experts(scores, bias_->v(), n, experts_, k_, scaling_, routing.selected, routing.weights);
}

void Router::backward(const float* u, const Routing& routing, float* d_scores, float* du, Arena& scratch) {
  const int64_t n = routing.tokens;
  const float* s = routing.s();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * experts_; ++i) d_scores[i] *= s[i] * (1.0f - s[i]);  // σ' = σ(1 − σ)
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

void select_experts(const float* scores, const float* bias, int64_t n, int64_t experts, int64_t k, float scaling,
                    int32_t* selected, float* weights) {
  parallel_rows(n, experts, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* s = scores + t * experts;
      int32_t* ids = selected + t * k;
      float* best = weights + t * k;  // the biased values of the current top-k, best first
      int64_t count = 0;
      for (int64_t e = 0; e < experts; ++e) {
        const float v = s[e] + bias[e];
        if (count == k && !(v > best[k - 1])) continue;
        // Strictly greater moves up: an equal value stays behind the lower id already there.
        int64_t i = count < k ? count++ : k - 1;
        for (; i > 0 && v > best[i - 1]; --i) best[i] = best[i - 1], ids[i] = ids[i - 1];
        best[i] = v, ids[i] = int32_t(e);
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) sum += s[ids[i]];
      const float scale = scaling / sum;
      for (int64_t i = 0; i < k; ++i) best[i] = s[ids[i]] * scale;
    }
  });
}

void routing_weights_backward(const Routing& routing, float scaling, const float* d_weights, float* d_scores) {
  const int64_t n = routing.tokens, E = routing.experts, k = routing.k;
  const float* s = routing.s();
  const int32_t* ids = routing.expert_ids();
  const float* w = routing.w();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    float* ds = d_scores + t * E;
    std::memset(ds, 0, size_t(E) * sizeof(float));
    // w_i = S s_i / Z  ⇒  dL/ds_j = S/Z · (dL/dw_j − Σ_i dL/dw_i · w_i / S), Z = Σ_top-k s.
    float z = 0.0f, weighted = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      z += s[t * E + ids[t * k + i]];
      weighted += d_weights[t * k + i] * w[t * k + i];
    }
    const float scale = scaling / z, mean = weighted / scaling;
    for (int64_t i = 0; i < k; ++i) ds[ids[t * k + i]] = scale * (d_weights[t * k + i] - mean);
  }
}

}  // namespace hyla
