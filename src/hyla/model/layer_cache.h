#pragma once
// One layer's part of one sequence's inference state: the memory interface every mixer shares
// (llama.cpp's hybrid memory: a recurrent state and an attention cache behind one type). A mixer's
// forward takes one slot per sequence of the batch, or none (every sequence starts empty).
//
// What crosses this seam: pointers into memory the caller owns (infer/sequence_state.h allocates
// it once per sequence, each layer's as its kind's StateSpec says, model/state_spec.h) and the
// number of cached tokens. Never the mixers' own buffers, their
// parameters, or anything that lives past one forward.
#include <cstdint>
#include <variant>
#include <vector>

#include "hyla/core/half.h"

namespace hyla {

// A KDA layer (SPEC §3): the conv tails [3, kernel−1, H·K] (q, k, v) and the delta-rule state
// [H, K, V], both f32 and of fixed size, updated in place.
struct RecurrentState {
  float* conv_tails = nullptr;
  float* state = nullptr;
};

// A latent attention layer (SPEC §4): `capacity` rows of (normalised c, rotated k_pe) per token,
// bf16 or f32 (exactly one pointer set), the first `length` filled; a forward appends its tokens.
struct LatentCache {
  bf16* latent_bf16 = nullptr;
  float* latent_f32 = nullptr;
  int64_t length = 0;
  int64_t capacity = 0;
};

using LayerCache = std::variant<RecurrentState, LatentCache>;

// One sequence's state for every layer, in layer order, and the tokens it has processed
// (positions continue from here).
struct SequenceCache {
  std::vector<LayerCache> layers;
  int64_t tokens = 0;
};

}  // namespace hyla
