#pragma once
// Expert parallelism's seam: between dispatch and combine (moe_dispatch.h), each routed expert's
// block of slot rows is computed by the process that holds the expert, and comes back for the
// combine; the backward sends the same blocks the other way.
//
// What crosses it: the dispatch (which slots belong to which expert), each slot's input row
// (forward) or its token's output gradient (backward), and the slot rows that come back (outputs;
// input gradients and routing-weight gradients). Never parameters, the router, the balancing or
// the combine: those stay with every process.
#include <cstdint>
#include <functional>
#include <string>

#include "hyla/core/workspace.h"
#include "hyla/model/moe_dispatch.h"
#include "hyla/model/moe_experts.h"
#include "hyla/model/params.h"

namespace hyla {

class ExpertExchange {
 public:
  // Runs the routed experts in [first, last) on this process over the layer's own slots.
  using Compute = std::function<void(int64_t first, int64_t last)>;
  // This process's routed experts, for an exchange that runs other processes' slot rows on them
  // (their own dispatch, inputs and saved activations).
  struct Held {
    RoutedExperts& experts;
    Precision precision;
    bool save;  // a training forward: its backward follows
    Workspace& workspace;
  };
  virtual ~ExpertExchange() = default;
  // x [tokens, width]: the experts' input; slot_rows [slots, width]: every slot's output on return.
  virtual void forward(const ExpertDispatch& dispatch, const float* x, int64_t width, float* slot_rows,
                       const Compute& compute, const Held& held) = 0;
  // dm [tokens, width]: dL/d(combined output); d_slot_in [slots, width] and d_slot_weight [slots]
  // hold every slot's gradients on return.
  virtual void backward(const ExpertDispatch& dispatch, const float* dm, int64_t width, float* d_slot_in,
                        float* d_slot_weight, const Compute& compute, const Held& held) = 0;
};

// Every expert on this process: the exchange is the identity.
class LocalExperts final : public ExpertExchange {
 public:
  void forward(const ExpertDispatch& dispatch, const float*, int64_t, float*, const Compute& compute,
               const Held&) override {
    compute(0, dispatch.experts);
  }
  void backward(const ExpertDispatch& dispatch, const float*, int64_t, float*, float*, const Compute& compute,
                const Held&) override {
    compute(0, dispatch.experts);
  }
};

LocalExperts& local_experts();

// Parameter ownership: the routed expert a parameter belongs to (the E of
// model.layers.L.mlp.experts.E.*), or -1 for every other parameter.
int64_t routed_expert_of(const std::string& name);
// The ParamStore::hold_only filter of a process that holds the routed experts [first, last) of
// every MoE layer and every parameter that is not a routed expert's.
std::function<bool(const Param&)> holds_experts(int64_t first, int64_t last);

}  // namespace hyla
