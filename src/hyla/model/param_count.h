#pragma once
// Parameter counts from a config alone (no tensors): total, and active per token with routed
// experts counted k of E. Must equal the tensors the model creates (tested).
#include <array>
#include <cstdint>

#include "hyla/model/config.h"

namespace hyla {

enum class Component : uint8_t {
  Embeddings,     // embed_tokens, lm_head
  Kda,            // KDA mixers
  Mla,            // latent attention mixers
  Router,         // MoE router weights, latent router centres, balancing bias
  RoutedExperts,  // the E routed experts (active: k of E)
  SharedExperts,  // always-on shared experts
  MoeLatent,      // latent MoE down/up projections and their norm
  DenseFfn,       // dense FFN layers (l < first_k_dense_replace)
  AttnRes,        // AttnRes pseudo-queries and norms
  Norms,          // input/post-attention layernorms and the final norm
  Vision,         // patch projection and grid embeddings, or MoonViT's tower and projector
  kCount
};
constexpr int kNumComponents = int(Component::kCount);
const char* component_name(Component c);

struct ParamCounts {
  std::array<int64_t, kNumComponents> total{}, active{};
  int64_t total_sum() const;
  int64_t active_sum() const;
};

ParamCounts count_parameters(const ModelConfig& config);

}  // namespace hyla
