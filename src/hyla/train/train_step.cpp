#include "hyla/train/train_step.h"

#include <cmath>

namespace hyla {

StepResult train_step(Model& model, AdamW& optimizer, const TrainConfig& config, double lr,
                      const std::function<ModelInput(int64_t m)>& micro_batch, Collective& collective) {
  StepResult r;
  model.params().zero_grads();
  // Each micro-batch's share of the mean over every replica's micro-batches.
  const ForwardOptions options{.precision = config.precision, .outputs = Outputs::None, .backward = true,
                               .loss_scale = 1.0f / float(config.grad_accum * collective.size())};
  for (int64_t m = 0; m < config.grad_accum; ++m) {
    const ModelInput in = micro_batch(m);
    const LossResult loss = model.forward(in, options).loss;
    r.loss += loss.loss / double(config.grad_accum);
    r.aux_loss += loss.aux_loss / double(config.grad_accum);
    r.tokens += in.tokens.rows;
  }
  collective.sum(std::span<float>(model.params().grads(), size_t(model.params().numel())));
  r.grad_norm = optimizer.grad_norm();
  r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (r.skipped) {
    model.discard_routing();
    return r;
  }
  const float scale =
      config.grad_clip > 0 && r.grad_norm > config.grad_clip ? float(config.grad_clip / r.grad_norm) : 1.0f;
  optimizer.step(lr, scale);
  model.update_balancing(collective);
  return r;
}

}  // namespace hyla
