#include "hyla/plan/sequence_memory.h"

#include <algorithm>

#include "hyla/plan/layer_mix.h"

namespace hyla {

SequenceMemory sequence_memory(const ModelConfig& c, int64_t context, double cache_bytes_per_value) {
  const LayerMix mix = layer_mix(c);
  const MlaConfig& m = c.mla;
  SequenceMemory s;
  s.latent_values_per_token = m.kv_lora_rank + m.qk_rope_head_dim;
  const int64_t swa_tokens = std::min(context, m.sliding_window);
  const double cached_tokens = double(mix.mla) * double(context) + double(mix.swa) * double(swa_tokens);
  s.latent_cache_bytes = cached_tokens * double(s.latent_values_per_token) * cache_bytes_per_value;

  // The recurrent state and the conv inputs are kept in f32, as SPEC §3 computes them.
  const double H = double(c.kda.num_heads), K = double(c.kda.head_dim);
  s.kda_state_bytes = double(mix.kda) * H * K * K * 4;
  s.conv_tail_bytes = double(mix.kda) * 3 * H * K * double(c.kda.conv_kernel - 1) * 4;

  s.mha_values_per_token = m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim);
  const double mha_bytes_per_token = double(s.mha_values_per_token) * cache_bytes_per_value;
  s.mha_attention_layers_bytes = cached_tokens * mha_bytes_per_token;
  s.mha_all_layers_bytes = double(c.num_hidden_layers) * double(context) * mha_bytes_per_token;
  return s;
}

}  // namespace hyla
