#pragma once
// Gated latent attention mixer (SPEC §4): full causal ("mla") or sliding-window ("swa").
#include <string>

#include "hyla/model/layers.h"

namespace hyla {

class MlaMixer {
 public:
  MlaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config, LayerType type);

 private:
  const ModelConfig& config_;
  LayerType type_;
  // Registered in this order so that the projections of u, [q (or q_a) | kv_a | g], are one matrix.
  Linear q_proj_, q_a_proj_, kv_a_proj_, g_proj_, q_b_proj_, kv_b_proj_, o_proj_;
  RmsNorm q_a_norm_, kv_a_norm_;
};

}  // namespace hyla
