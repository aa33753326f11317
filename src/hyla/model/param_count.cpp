#include "hyla/model/param_count.h"

#include <numeric>

namespace hyla {

const char* component_name(Component c) {
  static constexpr const char* kNames[kNumComponents] = {
      "embeddings", "kda", "latent_attention", "router", "routed_experts", "shared_experts",
      "moe_latent", "dense_ffn", "attn_res", "norms", "vision"};
  return kNames[int(c)];
}

int64_t ParamCounts::total_sum() const { return std::accumulate(total.begin(), total.end(), int64_t(0)); }
int64_t ParamCounts::active_sum() const { return std::accumulate(active.begin(), active.end(), int64_t(0)); }

ParamCounts count_parameters(const ModelConfig& c) {
  ParamCounts n;
  auto add = [&n](Component comp, int64_t total, int64_t active) {
    n.total[int(comp)] += total;
    n.active[int(comp)] += active;
  };
  auto add_all = [&add](Component comp, int64_t count) { add(comp, count, count); };
  const int64_t d = c.hidden_size;

  add_all(Component::Embeddings, c.vocab_size * d * (c.tie_word_embeddings ? 1 : 2));
  add_all(Component::Norms, d * (2 * c.num_hidden_layers + 1));
  if (c.attn_res.enabled) add_all(Component::AttnRes, 4 * d * c.num_hidden_layers + 2 * d);
  const int64_t patch = c.vision.patch_size * c.vision.patch_size * c.vision.channels;
  if (c.vision.enabled && c.vision.tower == VisionTower::MoonVit) {
    const MoonVitConfig& m = c.vision.moonvit;
    const int64_t D = m.hidden_size, inner = m.num_heads * m.head_dim, I = m.intermediate_size;
    const int64_t merged = m.merge * m.merge * D, b = m.bias ? 1 : 0;
    const int64_t norm = m.norm == VisionNorm::LayerNorm ? 2 * D : D;
    const int64_t block = 2 * norm + (D + b) * 3 * inner + (inner + b) * D + (D + b) * I + (I + b) * D;
    const int64_t projector = m.projector == VisionProjector::PatchMerger
                                  ? 2 * D + (merged + 1) * merged + (merged + 1) * d
                                  : merged * merged + merged * d + d;
    // Total only: a text token never runs the tower (an image's tokens are its prefill's work).
    add(Component::Vision, (patch + b) * D + m.pos_emb_height * m.pos_emb_width * D + m.num_layers * block + norm +
                               projector,
        0);
  } else if (c.vision.enabled) {
    add_all(Component::Vision, d * patch + d + 2 * c.vision.max_grid * d);
  }

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.layer_types[size_t(l)] == LayerType::Kda) {
      const int64_t H = c.kda.num_heads, K = c.kda.head_dim, HK = H * K;
      // A gate's logits from d: one [HK, d] matrix, or [rank, d] then [HK, rank].
      auto gate = [&](int64_t rank) { return rank == 0 ? HK * d : rank * d + HK * rank; };
      add_all(Component::Kda, 3 * HK * d + gate(c.kda.gate_rank) + gate(c.kda.output_gate_rank)  // q k v f g
                                  + d * HK     // o_proj
                                  + H * d      // b_proj
                                  + 3 * HK * c.kda.conv_kernel + H + HK + K);  // convs, A_log, dt_bias, o_norm
    } else {
      const MlaConfig& m = c.mla;
      const int64_t H = m.num_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      const int64_t q = m.q_lora_rank == 0 ? H * qk * d : m.q_lora_rank * d + m.q_lora_rank + H * qk * m.q_lora_rank;
      add_all(Component::Mla, q + (m.kv_lora_rank + m.qk_rope_head_dim) * d + m.kv_lora_rank +
                                  H * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank +
                                  (m.output_gate ? (m.output_gate_per_head ? H : H * m.v_head_dim) * d : 0) + d * H * m.v_head_dim);
    }
    if (!c.is_moe_layer(l)) {
      add_all(Component::DenseFfn, 3 * d * c.moe.intermediate_size);
      continue;
    }
    const MoeConfig& m = c.moe;
    const int64_t E = m.num_experts, r = m.router_latent_dim;
    add_all(Component::Router, (r == 0 ? E * d : r * d + E * r) + E);
    const int64_t width = m.latent_dim > 0 ? m.latent_dim : d;
    const int64_t expert = 3 * width * m.moe_intermediate_size;
    add(Component::RoutedExperts, E * expert, m.num_experts_per_tok * expert);
    add_all(Component::SharedExperts,
            3 * (m.shared_full_width ? d : width) * m.shared_width());
    if (m.latent_dim > 0) add_all(Component::MoeLatent, 2 * d * m.latent_dim + (m.latent_norm ? m.latent_dim : 0));
  }
  return n;
}

}  // namespace hyla
