#pragma once
// One optimiser step: zero the gradients, accumulate the micro-batches' (each loss scaled by
// 1 / micro-batches over every process), take the global norm, then either skip a non-finite step
// (its MoE routing forgotten, the balancing bias kept) or clip and apply AdamW and update the MoE
// balancing.
//
// What crosses this seam: the model, its optimiser, and the micro-batches as model inputs. A
// loss other than next-token prediction plugs in through the inputs (per-row loss weights:
// advantages for policy gradients, zero for prompts and tool outputs). Data-parallel processes
// pass a GradientReducer: the last micro-batch's backward hands it the gradients as they become
// final, the step's loss and norm are every process's, and its collective sums the MoE loads
// before the balancing update. Never data loading, logging, evaluation or checkpoints: those stay
// in the trainer (trainer.h).
#include <cstdint>
#include <functional>

#include "hyla/model/model.h"
#include "hyla/train/gradient_reducer.h"
#include "hyla/train/optimizer.h"
#include "hyla/train/optimizer_config.h"

namespace hyla {

struct StepResult {
  double loss = 0, aux_loss = 0;  // means over the micro-batches of every process
  double grad_norm = 0;           // before clipping
  int64_t tokens = 0;             // rows of the micro-batches of every process
  bool skipped = false;           // non-finite loss or gradient: no update
};

// `micro_batch(m)` gives this process's micro-batch m of settings.micro_batches.
StepResult train_step(Model& model, AdamW& optimizer, const StepSettings& settings, double lr,
                      const std::function<ModelInput(int64_t m)>& micro_batch);
StepResult train_step(Model& model, AdamW& optimizer, const StepSettings& settings, double lr,
                      const std::function<ModelInput(int64_t m)>& micro_batch, GradientReducer& reducer);

}  // namespace hyla
