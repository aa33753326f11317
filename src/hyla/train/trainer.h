#pragma once
// `hyla train`: the training loop over a prepared token dataset, with the context curriculum,
// evaluation, checkpoints, exact resume, NaN/Inf guard, metrics and samples.
#include <cstdint>
#include <string>
#include <vector>

namespace hyla {

struct TrainOptions {
  std::string model_config, train_config, data_dir, run_dir;
  std::string init_dir;  // start from this model directory's weights (same config) instead of a fresh init
  std::vector<std::string> images_dirs;  // image-text records mixed in by the train config's images.ratio
  int64_t steps = 0;   // > 0: override the total step count
  int64_t batch = 0;   // > 0: sequences per step in every stage
  int64_t seq = 0;     // > 0: a single stage of this length
  double lr = 0;       // > 0: override the peak learning rate
  bool resume = false;
  bool overwrite = false;      // start over in a run directory that holds checkpoints (they are deleted)
  bool deterministic = false;  // one thread: bitwise-reproducible losses, across a resume too
  bool quiet = false;          // no per-step console lines
};

void run_training(const TrainOptions& options);

}  // namespace hyla
