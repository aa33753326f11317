#pragma once
// AdamW over the flat parameter buffers: decoupled weight decay on the SPEC §9 decay group,
// f32 moments, and the bf16 copies of the weights refreshed in the same pass.
//
// An optimiser may own only a shard of the buffers (ZeRO-1, gradient_reducer.h): its moments,
// its reduced gradients and its updates cover that range alone. Saved state names its parameters
// (adam.m/<parameter>/<first element>: a run of that parameter's moments), so that any other
// split — other shards, other experts held (expert parallelism) — loads it.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/model/params.h"
#include "hyla/train/optimizer_config.h"

namespace hyla {

class AdamW {
 public:
  // Over every parameter, or over `shard` of the flat buffers only.
  AdamW(ParamStore& params, const OptimizerConfig& config);
  AdamW(ParamStore& params, const OptimizerConfig& config, FlatRange shard);
  FlatRange shard() const { return shard_; }
  // The shard's gradients, which step() reads: the model's own gradients over every parameter,
  // else a buffer of the shard's length that the gradient reduction fills.
  float* shard_grads() { return shard_grads_; }
  // Σ g² over the shard's trainable gradients (double accumulation, deterministic for a thread
  // count): the square of the global norm once summed over the shards.
  double grad_square_sum() const;
  // One update of the shard at learning rate `lr`, with every gradient multiplied by
  // `grad_scale` first (clipping). Non-trainable parameters (the balancing bias) are left alone.
  void step(double lr, float grad_scale);
  int64_t steps() const { return steps_; }

  // The step count and the shard's moments of the parameters `writes` accepts (all by default),
  // to a safetensors file (written atomically); and this shard's moments from files so saved,
  // which must cover every one of its trainable parameters.
  void save(const std::filesystem::path& path, const std::function<bool(const Param&)>& writes = {}) const;
  void load(const std::vector<std::filesystem::path>& paths);

 private:
  struct Range {
    int64_t offset, count;  // into the flat buffers
    bool decay;
  };
  ParamStore& params_;
  FlatRange shard_;
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Range> ranges_;  // the shard's trainable parameters in chunks of at most 64K elements
  Tensor m_, v_;               // [shard_.count], at flat offset shard_.first
  Tensor own_grads_;           // a shard's reduced gradients, when the shard is not everything
  float* shard_grads_ = nullptr;
  int64_t steps_ = 0;
};

}  // namespace hyla
