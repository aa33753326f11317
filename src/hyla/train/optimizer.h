#pragma once
// AdamW over the flat parameter buffers: decoupled weight decay on the SPEC §9 decay group,
// f32 moments, and the bf16 copies of the weights refreshed in the same pass.
#include <cstdint>
#include <filesystem>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/model/params.h"
#include "hyla/train/train_config.h"

namespace hyla {

class AdamW {
 public:
  AdamW(ParamStore& params, const TrainConfig& config);
  // The L2 norm of every trainable gradient (double accumulation, deterministic for a thread count).
  double grad_norm() const;
  // One update at learning rate `lr`, with every gradient multiplied by `grad_scale` first
  // (clipping). Non-trainable parameters (the balancing bias) are left alone.
  void step(double lr, float grad_scale);
  int64_t steps() const { return steps_; }

  // Moments and step count, to and from a safetensors file (written atomically).
  void save(const std::filesystem::path& path) const;
  void load(const std::filesystem::path& path);

 private:
  struct Range {
    int64_t offset, count;  // into the flat buffers
    bool decay;
  };
  ParamStore& params_;
  double beta1_, beta2_, eps_, weight_decay_;
  std::vector<Range> ranges_;  // trainable parameters in chunks of at most 64K elements
  Tensor m_, v_;
  int64_t steps_ = 0;
};

}  // namespace hyla
