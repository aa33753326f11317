#pragma once
// What one layer of a mixer kind keeps for one sequence between forwards, from the config alone:
// the one statement of its size, which infer allocates (infer/sequence_state.h) and the planner
// adds up (plan/sequence_memory.h). Each mixer kind computes its own next to its forward
// (KdaMixer::state_spec, MlaMixer::state_spec); state_spec() maps a layer's kind to it, registered
// with the other per-kind choices in model/mixers.cpp.
#include <algorithm>
#include <cstdint>

#include "hyla/model/config.h"

namespace hyla {

struct StateSpec {
  // Fixed size, f32, updated in place (a RecurrentState, model/layer_cache.h): the conv tails,
  // then the recurrent state, back to back.
  int64_t conv_tail_floats = 0, state_floats = 0;
  // One row per cached token (a LatentCache), in the cache's dtype (bf16 or f32).
  int64_t values_per_token = 0;
  // Positions a token attends to, its own included (0: all). The cache keeps every token; only
  // these need to stay, which is what the planner counts.
  int64_t window = 0;

  int64_t fixed_floats() const { return conv_tail_floats + state_floats; }
  int64_t fixed_bytes() const { return fixed_floats() * 4; }
  int64_t needed_tokens(int64_t context) const { return window > 0 ? std::min(context, window) : context; }
};

StateSpec state_spec(const ModelConfig& config, LayerType type);

}  // namespace hyla
