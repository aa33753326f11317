#pragma once
// Expert parallelism over MPI: the ExpertExchange (model/expert_exchange.h) of one MoE layer on
// one process of an expert-parallel group. The group's G processes hold the routed experts in G
// contiguous ranges (process q: experts [E·q/G, E·(q+1)/G), expert_range below) and each routes its
// own tokens. Forward: every slot row goes to the process holding its expert, with its routing
// weight (the slots are numbered expert by expert, so each destination's rows are one block); the
// per-expert slot counts go first (all-to-all), the rows after (all-to-all-v). Each process runs
// its experts over every row it received, expert by expert in the senders' rank order, keeps what
// the backward needs, and sends the outputs back the same way (the combine stays with the
// sender). Backward: the slots' output gradients travel out on the same routes, and the input
// gradients and routing-weight gradients come back. Nothing else crosses: parameters, routers and
// balancing stay on every process.
#include <cstdint>
#include <utility>
#include <vector>

#include "hyla/model/collective.h"
#include "hyla/model/expert_exchange.h"

namespace hyla {

// The experts [first, last) process `rank` of a group of `size` holds, of `experts`, and the
// process that holds expert `e`.
std::pair<int64_t, int64_t> expert_range(int64_t experts, int rank, int size);
int expert_holder(int64_t experts, int64_t e, int size);

class ExpertParallelExchange final : public ExpertExchange {
 public:
  explicit ExpertParallelExchange(Collective& group) : group_(group) {}
  void forward(const ExpertDispatch& dispatch, const float* x, int64_t width, float* slot_rows, const Compute& compute,
               const Held& held) override;
  void backward(const ExpertDispatch& dispatch, const float* dm, int64_t width, float* d_slot_in, float* d_slot_weight,
                const Compute& compute, const Held& held) override;
  // Bytes sent to other processes so far (dispatch and combine, forward and backward, counts
  // included) and the wall time spent in those exchanges, for the traffic counters.
  int64_t bytes_sent() const { return bytes_sent_; }
  double seconds() const { return seconds_; }

 private:
  // What a forward received, kept for the backward when saving.
  struct Received {
    ExpertDispatch dispatch;       // over the received rows, in the order they were computed
    std::vector<int64_t> from;     // [G] rows from each process
    std::vector<int64_t> to;       // [G] rows this process sent to each
    std::vector<int32_t> arrival;  // [rows] the row's place in the receive buffer, by computed order
    std::vector<float> x, gu, h;   // inputs [rows, width], saved activations [rows, 2w] and [rows, w]
  };
  void exchange(const std::vector<int64_t>& send_rows, const std::vector<int64_t>& receive_rows, int64_t width,
                const float* send, float* receive);

  Collective& group_;
  Received saved_, work_;
  // Scratch, grown to the largest step and reused.
  std::vector<float> send_, receive_, out_, dm_rows_, d_in_, d_weight_;
  std::vector<int64_t> send_counts_, receive_counts_, loads_out_, loads_in_, next_slot_;
  int64_t bytes_sent_ = 0;
  double seconds_ = 0;
};

}  // namespace hyla
