#pragma once
// The MoE layer's token exchange (SPEC §5). A forward runs four stages:
//
//   route (router.h)  →  dispatch (here)  →  expert compute over an expert range (moe_experts.h)
//                     →  combine (here)
//
// Dispatch numbers the routed (token, choice) slots expert by expert (a counting sort; tokens stay
// ascending within an expert), so each expert's inputs and outputs are one contiguous block of
// slot rows. This is the seam for a multi-process version: after dispatch, each expert's block of
// input rows x[slot_token[j]] goes to the rank that owns the expert; that rank runs the expert
// compute on its range of experts and sends the output rows back for the combine. Backward
// exchanges the same blocks the other way (output gradients out, input gradients and per-slot
// weight gradients back). Nothing else crosses the seam.
#include <cstdint>
#include <vector>

#include "hyla/model/router.h"

namespace hyla {

struct ExpertDispatch {
  int64_t tokens = 0, k = 0, experts = 0;
  std::vector<int64_t> load;        // [E] slots of each expert
  std::vector<int64_t> offsets;     // [E + 1] expert e's slots are [offsets[e], offsets[e + 1])
  std::vector<int32_t> slot_token;  // [tokens·k] the token of each slot
  std::vector<float> slot_weight;   // [tokens·k] its routing weight
  std::vector<int32_t> token_slot;  // [tokens·k] at t·k + i: the slot of token t's i-th choice

  // Rebuilds every array from a routing (capacity is kept, so steady-state calls don't allocate).
  void build(const Routing& routing);
};

// y[t] = Σ_i c_i · slot_rows[token_slot[t·k + i]] (+ y[t] when `accumulate`), rows `width` wide;
// c_i is the slot's routing weight when `weighted`, else 1. Each token sums in a fixed order.
void combine_slots(const ExpertDispatch& dispatch, const float* slot_rows, int64_t width, bool weighted,
                   bool accumulate, float* y);

}  // namespace hyla
