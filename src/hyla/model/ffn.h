#pragma once
// Feed-forward sublayers (SPEC §5): the dense SwiGLU FFN and the MoE FFN with its router,
// routed experts, shared experts and optional latent projection.
#include <string>
#include <vector>

#include "hyla/model/layers.h"

namespace hyla {

// W_down(act(W_gate x, W_up x)); gate and up are registered together so [gate; up] is one matrix.
struct GatedMlp {
  Linear gate_proj, up_proj, down_proj;
  GatedMlp() = default;
  GatedMlp(ParamStore& store, const std::string& prefix, int64_t in, int64_t hidden, Component component);
};

class DenseFfn {
 public:
  DenseFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config);

 private:
  GatedMlp mlp_;
};

class MoeFfn {
 public:
  MoeFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config);

 private:
  const ModelConfig& config_;
  Linear router_, router_proj_;  // plain router [E, d], or latent router projection [r, d]
  Param* router_centres_ = nullptr;
  Param* score_bias_ = nullptr;  // the balancing bias b: a buffer, saved with the model
  Linear lat_down_, lat_up_;
  RmsNorm lat_norm_;
  std::vector<GatedMlp> experts_;
  GatedMlp shared_;
};

}  // namespace hyla
