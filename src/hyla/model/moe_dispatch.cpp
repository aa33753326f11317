#include "hyla/model/moe_dispatch.h"


#include "hyla/kernels/moe.h"

namespace hyla {

void ExpertDispatch::build(const Routing& routing) {
  tokens = routing.tokens, k = routing.k, experts = routing.experts;
  const int64_t slots = tokens * k;
  const int32_t* ids = routing.expert_ids();
  const float* w = routing.w();
  load.assign(size_t(experts), 0);
  for (int64_t i = 0; i < slots; ++i) ++load[size_t(ids[i])];
  offsets.resize(size_t(experts + 1));
  offsets[0] = 0;
  for (int64_t e = 0; e < experts; ++e) offsets[size_t(e + 1)] = offsets[size_t(e)] + load[size_t(e)];
  slot_token.resize(size_t(slots));
  slot_weight.resize(size_t(slots));
  token_slot.resize(size_t(slots));
  // `load` becomes each expert's next free slot; restored from the offsets below.
  for (int64_t e = 0; e < experts; ++e) load[size_t(e)] = offsets[size_t(e)];
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t slot = load[size_t(ids[i])]++;
    slot_token[size_t(slot)] = int32_t(i / k);
    slot_weight[size_t(slot)] = w[i];
    token_slot[size_t(i)] = int32_t(slot);
  }
  for (int64_t e = 0; e < experts; ++e) load[size_t(e)] = offsets[size_t(e + 1)] - offsets[size_t(e)];
}

void combine_slots(const ExpertDispatch& dispatch, const float* slot_rows, int64_t width, bool weighted,
                   bool accumulate, float* y) {
  combine_expert_rows(slot_rows, width, dispatch.token_slot.data(), weighted ? dispatch.slot_weight.data() : nullptr,
                      dispatch.tokens, dispatch.k, accumulate, y);
}

}  // namespace hyla
