#pragma once
// Data parallelism's seam: the reductions training needs across the processes that each hold a
// replica. Sums of a buffer over every process (the step's MoE balancing counts in balancing.h,
// the step's loss in train_step.h), the gradient reductions that overlap the backward pass
// (train/gradient_reducer.h: an all-reduce, or a reduce-scatter into an optimiser shard followed
// by an all-gather of the updated weights: ZeRO-1), and the few broadcasts a checkpoint needs.
//
// What crosses it: the buffers being reduced, gathered or broadcast. Never a model, parameters by
// name, or control flow: every process calls the same operations in the same order. The one
// implementation beside SingleProcess is MPI's (dist/mpi_collective.h).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hyla/core/error.h"

namespace hyla {

// Another process of the job stopped answering within the exchange timeout (a process killed,
// stopped or cut off): the job cannot go on. `ranks` are the processes that sent nothing in time.
class ProcessFailure : public Error {
 public:
  ProcessFailure(const std::string& message, std::vector<int> ranks) : Error(message), ranks(std::move(ranks)) {}
  std::vector<int> ranks;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place, blocking: every process's values, summed.
  virtual void sum(std::span<float> values) = 0;
  virtual void sum(std::span<double> values) = 0;
  virtual void sum(std::span<int64_t> values) = 0;
  // Started now, completed by wait(), in the order started; the buffers must not be touched in
  // between. start_sum: `values` summed in place. start_reduce_scatter: `values` is split in rank
  // order into parts of counts[r] elements; the sum over processes of this process's part is
  // written to `mine` (counts[rank()] elements).
  virtual void start_sum(std::span<float> values) = 0;
  virtual void start_reduce_scatter(std::span<const float> values, std::span<const int> counts, float* mine) = 0;
  virtual void wait() = 0;
  // In place, blocking: `values` split in rank order into parts of counts[r] elements; each
  // process's part goes to every process.
  virtual void all_gather(std::span<float> values, std::span<const int> counts) = 0;
  virtual void barrier() = 0;
  // Rank 0's text, on every process.
  virtual void broadcast(std::string& text) = 0;
  // Blocking exchanges between every pair of processes (expert parallelism's dispatch and
  // combine): all_to_all sends block r of `send` (send.size() / size() values) to process r and
  // receives process r's block for this one into block r of `receive`; all_to_all_v sends
  // send_counts[r] floats from `send` (in rank order) to process r and receives
  // receive_counts[r] floats from it into `receive` (in rank order).
  virtual void all_to_all(std::span<const int64_t> send, std::span<int64_t> receive) = 0;
  virtual void all_to_all_v(const float* send, std::span<const int64_t> send_counts, float* receive,
                            std::span<const int64_t> receive_counts) = 0;
  // The processes that pass the same `color`, ranked in this collective's order, as a collective
  // of their own (every process calls it together).
  virtual std::unique_ptr<Collective> split(int color) = 0;
  // From now on, an exchange (all_to_all, all_to_all_v, a broadcast's sending side) in which a
  // process sends nothing for `seconds` throws ProcessFailure naming it (0: wait forever).
  // Inference across processes sets it once every process has loaded its share; training leaves
  // it off (one process may write a checkpoint for minutes while the others wait).
  virtual void set_exchange_timeout(double seconds) {}
  // Seconds spent inside the reductions so far (on the thread that runs them), and bytes handed
  // to them (each operation's buffer: what this process sends into it).
  virtual double busy_seconds() const = 0;
  virtual int64_t bytes() const = 0;
};

// One process: every sum is the values themselves.
class SingleProcess final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(std::span<float>) override {}
  void sum(std::span<double>) override {}
  void sum(std::span<int64_t>) override {}
  void start_sum(std::span<float>) override {}
  void start_reduce_scatter(std::span<const float> values, std::span<const int> counts, float* mine) override;
  void wait() override {}
  void all_gather(std::span<float>, std::span<const int>) override {}
  void barrier() override {}
  void broadcast(std::string&) override {}
  void all_to_all(std::span<const int64_t> send, std::span<int64_t> receive) override;
  void all_to_all_v(const float* send, std::span<const int64_t> send_counts, float* receive,
                    std::span<const int64_t> receive_counts) override;
  std::unique_ptr<Collective> split(int color) override;
  double busy_seconds() const override { return 0; }
  int64_t bytes() const override { return 0; }
};

SingleProcess& single_process();

}  // namespace hyla
