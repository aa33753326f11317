#include "hyla/dist/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "hyla/core/clock.h"
#include "hyla/core/error.h"

namespace hyla {

std::pair<int64_t, int64_t> expert_range(int64_t experts, int rank, int size) {
  return {experts * rank / size, experts * (rank + 1) / size};
}

int expert_holder(int64_t experts, int64_t e, int size) {
  int rank = 0;
  while (expert_range(experts, rank, size).second <= e) ++rank;
  return rank;
}

void ExpertParallelExchange::exchange(const std::vector<int64_t>& send_rows, const std::vector<int64_t>& receive_rows,
                                      int64_t width, const float* send, float* receive) {
  const size_t G = send_rows.size();
  send_counts_.resize(G);
  receive_counts_.resize(G);
  for (size_t q = 0; q < G; ++q) {
    send_counts_[q] = send_rows[q] * width;
    receive_counts_[q] = receive_rows[q] * width;
    if (int(q) != group_.rank()) bytes_sent_ += send_counts_[q] * 4;
  }
  const auto t0 = std::chrono::steady_clock::now();
  group_.all_to_all_v(send, send_counts_, receive, receive_counts_);
  seconds_ += seconds_since(t0);
}

void ExpertParallelExchange::forward(const ExpertDispatch& dispatch, const float* x, int64_t width, float* slot_rows,
                                     const Compute&, const Held& held) {
  const int G = group_.size(), me = group_.rank();
  const int64_t E = dispatch.experts, slots = dispatch.tokens * dispatch.k;
  const auto [mine_first, mine_last] = expert_range(E, me, G);
  const int64_t held_experts = mine_last - mine_first;
  Received& r = held.save ? saved_ : work_;

  // Slot counts: block q of what is sent holds the loads of process q's experts; every process's
  // ranges have the same length only when G divides E, so the blocks are padded to the longest.
  const int64_t block = (E + G - 1) / G;
  std::vector<int64_t>& loads_out = loads_out_;
  std::vector<int64_t>& loads_in = loads_in_;
  loads_out.assign(size_t(G * block), 0);
  loads_in.assign(size_t(G * block), 0);
  r.to.assign(size_t(G), 0);
  for (int q = 0; q < G; ++q) {
    const auto [first, last] = expert_range(E, q, G);
    for (int64_t e = first; e < last; ++e) {
      loads_out[size_t(q * block + e - first)] = dispatch.load[size_t(e)];
      r.to[size_t(q)] += dispatch.load[size_t(e)];
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  group_.all_to_all(loads_out, loads_in);
  seconds_ += seconds_since(t0);
  bytes_sent_ += int64_t(loads_out.size() - size_t(held_experts)) * 8;
  r.from.assign(size_t(G), 0);
  for (int p = 0; p < G; ++p)
    for (int64_t i = 0; i < held_experts; ++i) r.from[size_t(p)] += loads_in[size_t(p * block + i)];
  int64_t received = 0;
  for (int64_t n : r.from) received += n;

  // Out: each slot's input row and routing weight, in slot order (destinations in rank order).
  const int64_t stride = width + 1;
  send_.resize(size_t(std::max<int64_t>(slots, 1) * stride));
  for (int64_t j = 0; j < slots; ++j) {
    std::memcpy(send_.data() + j * stride, x + int64_t(dispatch.slot_token[size_t(j)]) * width, size_t(width) * 4);
    send_[size_t(j * stride + width)] = dispatch.slot_weight[size_t(j)];
  }
  receive_.resize(size_t(std::max<int64_t>(received, 1) * stride));
  exchange(r.to, r.from, stride, send_.data(), receive_.data());

  // The received rows, expert by expert (senders in rank order within an expert): a dispatch
  // whose "tokens" are those rows, each its own slot.
  ExpertDispatch& d = r.dispatch;
  d.tokens = received, d.k = 1, d.experts = E;
  d.load.assign(size_t(E), 0);
  d.offsets.assign(size_t(E + 1), 0);
  for (int p = 0; p < G; ++p)
    for (int64_t i = 0; i < held_experts; ++i) d.load[size_t(mine_first + i)] += loads_in[size_t(p * block + i)];
  for (int64_t e = 0; e < E; ++e) d.offsets[size_t(e + 1)] = d.offsets[size_t(e)] + d.load[size_t(e)];
  d.slot_token.resize(size_t(received));
  d.token_slot.resize(size_t(received));
  d.slot_weight.resize(size_t(received));
  r.arrival.resize(size_t(received));
  r.x.resize(size_t(received * width));
  std::vector<int64_t>& next = next_slot_;
  next.assign(d.offsets.begin(), d.offsets.end() - 1);
  int64_t at = 0;
  for (int p = 0; p < G; ++p)
    for (int64_t i = 0; i < held_experts; ++i)
      for (int64_t n = 0; n < loads_in[size_t(p * block + i)]; ++n, ++at) {
        const int64_t slot = next[size_t(mine_first + i)]++;
        r.arrival[size_t(slot)] = int32_t(at);
        d.slot_token[size_t(slot)] = int32_t(slot);
        d.token_slot[size_t(slot)] = int32_t(slot);
        d.slot_weight[size_t(slot)] = receive_[size_t(at * stride + width)];
        std::memcpy(r.x.data() + slot * width, receive_.data() + at * stride, size_t(width) * 4);
      }

  const int64_t w = held.experts.width();
  ExpertActivations keep;
  if (held.save) {
    r.gu.resize(size_t(received * 2 * w));
    r.h.resize(size_t(received * w));
    keep = {r.gu.data(), r.h.data()};
  }
  out_.resize(size_t(std::max<int64_t>(received, 1) * width));
  held.experts.forward(r.x.data(), d, mine_first, mine_last, held.precision, keep, out_.data(), held.workspace);

  // Back: the outputs in arrival order, to their senders, landing in slot order.
  for (int64_t slot = 0; slot < received; ++slot)
    std::memcpy(receive_.data() + int64_t(r.arrival[size_t(slot)]) * width, out_.data() + slot * width, size_t(width) * 4);
  exchange(r.from, r.to, width, receive_.data(), slot_rows);
}

void ExpertParallelExchange::backward(const ExpertDispatch& dispatch, const float* dm, int64_t width, float* d_slot_in,
                                      float* d_slot_weight, const Compute&, const Held& held) {
  const int G = group_.size(), me = group_.rank();
  const int64_t E = dispatch.experts, slots = dispatch.tokens * dispatch.k;
  const auto [mine_first, mine_last] = expert_range(E, me, G);
  Received& r = saved_;
  const int64_t received = r.dispatch.tokens;
  HYLA_ASSERT(int64_t(r.to.size()) == G);

  // Out: each slot's token output gradient, on the forward's routes.
  send_.resize(size_t(std::max<int64_t>(slots, 1) * width));
  for (int64_t j = 0; j < slots; ++j)
    std::memcpy(send_.data() + j * width, dm + int64_t(dispatch.slot_token[size_t(j)]) * width, size_t(width) * 4);
  receive_.resize(size_t(std::max<int64_t>(received, 1) * (width + 1)));
  exchange(r.to, r.from, width, send_.data(), receive_.data());
  dm_rows_.resize(size_t(std::max<int64_t>(received, 1) * width));
  for (int64_t slot = 0; slot < received; ++slot)
    std::memcpy(dm_rows_.data() + slot * width, receive_.data() + int64_t(r.arrival[size_t(slot)]) * width, size_t(width) * 4);

  d_in_.resize(size_t(std::max<int64_t>(received, 1) * width));
  d_weight_.resize(size_t(std::max<int64_t>(received, 1)));
  held.experts.backward(r.x.data(), dm_rows_.data(), r.dispatch, mine_first, mine_last,
                        ExpertActivations{r.gu.data(), r.h.data()}, held.precision, d_in_.data(), d_weight_.data(),
                        held.workspace);

  // Back: input gradient and routing-weight gradient per row, in arrival order.
  const int64_t stride = width + 1;
  for (int64_t slot = 0; slot < received; ++slot) {
    float* row = receive_.data() + int64_t(r.arrival[size_t(slot)]) * stride;
    std::memcpy(row, d_in_.data() + slot * width, size_t(width) * 4);
    row[width] = d_weight_[size_t(slot)];
  }
  send_.resize(size_t(std::max<int64_t>(slots, 1) * stride));
  exchange(r.from, r.to, stride, receive_.data(), send_.data());
  for (int64_t j = 0; j < slots; ++j) {
    std::memcpy(d_slot_in + j * width, send_.data() + j * stride, size_t(width) * 4);
    d_slot_weight[j] = send_[size_t(j * stride + width)];
  }
}

}  // namespace hyla
