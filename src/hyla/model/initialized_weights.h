#pragma once
// A freshly initialised model (SPEC §9: `hyla init`'s values for the same seed) as ModelWeights
// whose tensors are computed when they are read, so that a writer that streams them
// (save_gguf, save_safetensors) holds a few tensors at a time whatever the model's size: a
// real-size checkpoint with random weights, written without holding it in memory.
#include <cstdint>
#include <memory>

#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"

namespace hyla {

// With `mxfp4_experts`, the routed experts are MXFP4 (U8 codes and `.scale` tensors, the rounding
// of `hyla quantize --experts mxfp4`), the other tensors F32. Routed experts are computed ahead
// in parallel batches of one layer's matrix, in expert order (the order writers read them).
std::shared_ptr<const ModelWeights> initialized_weights(const ModelConfig& config, uint64_t seed, bool mxfp4_experts);

}  // namespace hyla
