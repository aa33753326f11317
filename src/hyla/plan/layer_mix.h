#pragma once
// How many layers of each mixer kind a config has: every per-token memory and FLOP figure of the
// planner scales with these counts.
#include <cstdint>

#include "hyla/model/config.h"

namespace hyla {

struct LayerMix {
  int64_t kda = 0, mla = 0, swa = 0;
  int64_t attention() const { return mla + swa; }
};

inline LayerMix layer_mix(const ModelConfig& c) {
  LayerMix mix;
  for (LayerType t : c.layer_types) (t == LayerType::Kda ? mix.kda : t == LayerType::Mla ? mix.mla : mix.swa)++;
  return mix;
}

}  // namespace hyla
