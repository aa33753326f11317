#pragma once
// What one sequence keeps on the device between decode steps at a given context length (SPEC §3,
// §4), the layers' StateSpecs (model/state_spec.h) added up: the latent cache, which grows with
// tokens, and the KDA states and conv tails, which do not; plus what full multi-head attention of
// the same width would keep instead.
#include <cstdint>

#include "hyla/model/config.h"

namespace hyla {

struct SequenceMemory {
  int64_t latent_values_per_token = 0;    // kv_lora_rank + qk_rope_head_dim, per attention layer
  double latent_cache_bytes = 0;          // swa layers keep at most the window
  double kda_state_bytes = 0;             // H·K·V f32 per KDA layer
  double conv_tail_bytes = 0;             // 3·H·K·(kernel−1) f32 per KDA layer
  int64_t mha_values_per_token = 0;       // H·(Dn+Dr) keys + H·Dv values, per layer
  double mha_attention_layers_bytes = 0;  // full MHA in place of the latent cache, same layers
  double mha_all_layers_bytes = 0;        // full MHA in every layer (no KDA)

  double fixed_bytes() const { return kda_state_bytes + conv_tail_bytes; }
  double total_bytes() const { return latent_cache_bytes + fixed_bytes(); }
};

// `cache_bytes_per_value`: the latent (and comparison MHA) cache format; KDA states stay f32.
SequenceMemory sequence_memory(const ModelConfig& config, int64_t context, double cache_bytes_per_value);

}  // namespace hyla
