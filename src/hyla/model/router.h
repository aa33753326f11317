#pragma once
// The MoE router (SPEC §5): scores s = σ(W_r u), or with a latent router s_e = σ(c_e · (W_rl u));
// selection of the top-k experts by s + b (b the balancing bias, a buffer without gradient);
// routing weights from the unbiased s, w_i = s_i / Σ_{j∈top-k} s_j · routed_scaling_factor.
//
// The router's products stay f32 under Precision::BF16 too: the selection is discrete, and bf16
// rounding of u (3 significant digits) would flip near-tied choices between the two precisions.
// They are ~6% of the layer's FLOPs at configs/small.json. For the same reason `hyla quantize`
// leaves the router's weights floating point (WeightStorage::FloatOnly).
#include <cstdint>
#include <string>

#include "hyla/model/layer_buffer.h"
#include "hyla/model/layers.h"

namespace hyla {

// One forward's routing of `tokens` rows, in memory the caller provides (its activations).
struct Routing {
  int64_t tokens = 0, experts = 0, k = 0;
  float* scores = nullptr;      // [tokens, experts] s
  int32_t* selected = nullptr;  // [tokens, k] expert ids, best first by s + b; ties go to the lower id
  float* weights = nullptr;     // [tokens, k] w_i
  float* latent = nullptr;      // [tokens, r] W_rl u (latent router only)

  const float* s() const { return scores; }
  const int32_t* expert_ids() const { return selected; }
  const float* w() const { return weights; }
};

class Router {
 public:
  Router() = default;
  // Registers gate.weight (or gate.proj.weight and gate.centres), then gate.e_score_correction_bias.
  Router(ParamStore& store, const std::string& prefix, const ModelConfig& config);

  Param& bias() const { return *bias_; }

  // Routes n rows of u ([n, d]); the routing's arrays are taken from `activations`.
  Routing route(const float* u, int64_t n, LayerActivations& activations) const;
  // The same into arrays the caller sized (Routing's comments): e.g. another layer's input routed
  // by this router to predict its choices (expert_offload.h).
  void route_into(const float* u, Routing& routing) const;
  int64_t k() const { return k_; }
  int64_t latent() const { return latent_; }

  // d_scores [n, E] (dL/ds, overwritten with dL/dlogits) → the router's parameter gradients (+=)
  // and du += dL/du; u and routing as in the forward; scratch from `scratch`.
  void backward(const float* u, const Routing& routing, float* d_scores, float* du, Arena& scratch);

 private:
  Linear weight_;  // plain router [E, d]
  Linear proj_;    // latent router projection [r, d]
  Param* centres_ = nullptr;  // [E, r]
  Param* bias_ = nullptr;     // [E]
  int64_t experts_ = 0, k_ = 0, latent_ = 0;
  float scaling_ = 1.0f;
};

}  // namespace hyla
