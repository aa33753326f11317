#include "hyla/model/mla_mixer.h"

namespace hyla {

MlaMixer::MlaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config, LayerType type)
    : config_(config), type_(type) {
  const MlaConfig& m = config.mla;
  const int64_t d = config.hidden_size, H = m.num_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const Component c = Component::Mla;
  if (m.q_lora_rank == 0) q_proj_ = Linear(store, prefix + "q_proj", d, H * qk, c);
  else q_a_proj_ = Linear(store, prefix + "q_a_proj", d, m.q_lora_rank, c);
  kv_a_proj_ = Linear(store, prefix + "kv_a_proj_with_mqa", d, m.kv_lora_rank + m.qk_rope_head_dim, c);
  if (m.output_gate) g_proj_ = Linear(store, prefix + "g_proj", d, H * m.v_head_dim, c);
  if (m.q_lora_rank > 0) {
    q_a_norm_ = RmsNorm(store, prefix + "q_a_layernorm", m.q_lora_rank, c, float(config.rms_norm_eps));
    q_b_proj_ = Linear(store, prefix + "q_b_proj", m.q_lora_rank, H * qk, c);
  }
  kv_a_norm_ = RmsNorm(store, prefix + "kv_a_layernorm", m.kv_lora_rank, c, float(config.rms_norm_eps));
  kv_b_proj_ = Linear(store, prefix + "kv_b_proj", m.kv_lora_rank, H * (m.qk_nope_head_dim + m.v_head_dim), c);
  o_proj_ = Linear(store, prefix + "o_proj", H * m.v_head_dim, d, c, Init::NormalOutput);
}

}  // namespace hyla
