#pragma once
// Data parallelism's seam: the reductions training needs across the processes that each hold a
// replica, sums of a buffer over every process (the step's gradients in train_step.h, the MoE
// load counts of a step in balancing.h).
//
// What crosses it: the buffers being summed. Never a model, parameters by name, or control flow:
// every process calls the same reductions in the same order.
#include <cstdint>
#include <span>

namespace hyla {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every process's values, summed.
  virtual void sum(std::span<float> values) = 0;
  virtual void sum(std::span<int64_t> values) = 0;
};

// One process: every sum is the values themselves.
class SingleProcess final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void sum(std::span<float>) override {}
  void sum(std::span<int64_t>) override {}
};

SingleProcess& single_process();

}  // namespace hyla
