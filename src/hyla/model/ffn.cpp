#include "hyla/model/ffn.h"

namespace hyla {

GatedMlp::GatedMlp(ParamStore& store, const std::string& prefix, int64_t in, int64_t hidden, Component component)
    : gate_proj(store, prefix + "gate_proj", in, hidden, component),
      up_proj(store, prefix + "up_proj", in, hidden, component),
      down_proj(store, prefix + "down_proj", hidden, in, component, Init::NormalOutput) {}

DenseFfn::DenseFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : mlp_(store, prefix, config.hidden_size, config.moe.intermediate_size, Component::DenseFfn) {}

MoeFfn::MoeFfn(ParamStore& store, const std::string& prefix, const ModelConfig& config) : config_(config) {
  const MoeConfig& m = config.moe;
  const int64_t d = config.hidden_size, width = m.latent_dim > 0 ? m.latent_dim : d;
  if (m.router_latent_dim == 0) {
    router_ = Linear(store, prefix + "gate", d, m.num_experts, Component::Router);
  } else {
    router_proj_ = Linear(store, prefix + "gate.proj", d, m.router_latent_dim, Component::Router);
    router_centres_ = &store.add(prefix + "gate.centres", {m.num_experts, m.router_latent_dim}, Init::Normal,
                                 Component::Router, /*weight_decay=*/false);
  }
  score_bias_ = &store.add(prefix + "gate.e_score_correction_bias", {m.num_experts}, Init::Zeros, Component::Router,
                           /*weight_decay=*/false, /*trainable=*/false);
  if (m.latent_dim > 0) {
    lat_down_ = Linear(store, prefix + "lat_down", d, m.latent_dim, Component::MoeLatent);
    lat_norm_ = RmsNorm(store, prefix + "lat_norm", m.latent_dim, Component::MoeLatent, float(config.rms_norm_eps));
    lat_up_ = Linear(store, prefix + "lat_up", m.latent_dim, d, Component::MoeLatent, Init::NormalOutput);
  }
  experts_.reserve(size_t(m.num_experts));
  for (int64_t e = 0; e < m.num_experts; ++e)
    experts_.emplace_back(store, prefix + "experts." + std::to_string(e) + ".", width, m.moe_intermediate_size,
                          Component::RoutedExperts);
  if (m.num_shared_experts > 0)
    shared_ = GatedMlp(store, prefix + "shared_experts.", width, m.num_shared_experts * m.moe_intermediate_size,
                       Component::SharedExperts);
}

}  // namespace hyla
