#include "hyla/plan/sequence_memory.h"

#include "hyla/model/state_spec.h"

namespace hyla {

SequenceMemory sequence_memory(const ModelConfig& c, int64_t context, double cache_bytes_per_value) {
  const MlaConfig& m = c.mla;
  SequenceMemory s;
  s.latent_values_per_token = state_spec(c, LayerType::Mla).values_per_token;
  // Each layer's state as inference allocates it (model/state_spec.h), the recurrent state and the
  // conv inputs in f32 as SPEC §3 computes them, except that a windowed layer counts only the
  // tokens it attends to.
  double cached_tokens = 0, cached_values = 0;
  for (LayerType type : c.layer_types) {
    const StateSpec spec = state_spec(c, type);
    s.kda_state_bytes += double(spec.state_floats) * 4;
    s.conv_tail_bytes += double(spec.conv_tail_floats) * 4;
    if (spec.values_per_token == 0) continue;
    const int64_t tokens = spec.needed_tokens(context);
    cached_tokens += double(tokens);
    cached_values += double(tokens) * double(spec.values_per_token);
  }
  s.latent_cache_bytes = cached_values * cache_bytes_per_value;

  s.mha_values_per_token = m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim);
  const double mha_bytes_per_token = double(s.mha_values_per_token) * cache_bytes_per_value;
  s.mha_attention_layers_bytes = cached_tokens * mha_bytes_per_token;
  s.mha_all_layers_bytes = double(c.num_hidden_layers) * double(context) * mha_bytes_per_token;
  return s;
}

}  // namespace hyla
