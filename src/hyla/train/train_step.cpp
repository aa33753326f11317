#include "hyla/train/train_step.h"

#include <cmath>

namespace hyla {
namespace {

StepResult step(Model& model, AdamW& optimizer, const StepSettings& settings, double lr,
                const std::function<ModelInput(int64_t m)>& micro_batch, GradientReducer* reducer) {
  Collective& collective = reducer ? reducer->collective() : single_process();
  StepResult r;
  model.params().zero_grads();
  // Each micro-batch's share of the mean over every process's micro-batches.
  const ForwardOptions options{.precision = settings.precision, .outputs = Outputs::None, .backward = true,
                               .loss_scale = 1.0f / float(settings.micro_batches * collective.size())};
  double sums[3] = {0, 0, 0};  // loss, aux_loss, tokens
  for (int64_t m = 0; m < settings.micro_batches; ++m) {
    const ModelInput in = micro_batch(m);
    if (reducer && m + 1 == settings.micro_batches) {
      reducer->arm(model.params().grads(), optimizer.shard_grads());
      model.set_gradient_hook([reducer](int64_t offset) { reducer->gradients_final_from(offset); });
    }
    const LossResult loss = model.forward(in, options).loss;
    sums[0] += loss.loss;
    sums[1] += loss.aux_loss;
    sums[2] += double(in.tokens.rows);
  }
  if (reducer) {
    model.set_gradient_hook({});
    reducer->finish();
  }
  collective.sum(std::span<double>(sums));
  const double micro_batches = double(settings.micro_batches * collective.size());
  r.loss = sums[0] / micro_batches;
  r.aux_loss = sums[1] / micro_batches;
  r.tokens = int64_t(sums[2]);
  double square_sum = optimizer.grad_square_sum();
  if (reducer && reducer->sharded()) collective.sum(std::span<double>(&square_sum, 1));
  r.grad_norm = std::sqrt(square_sum);
  r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (r.skipped) {
    model.discard_routing();
    return r;
  }
  const float scale =
      settings.grad_clip > 0 && r.grad_norm > settings.grad_clip ? float(settings.grad_clip / r.grad_norm) : 1.0f;
  optimizer.step(lr, scale);
  if (reducer && reducer->sharded()) {
    reducer->gather(model.params().values());
    model.params().refresh_bf16();
  }
  model.update_balancing(collective);
  return r;
}

}  // namespace

StepResult train_step(Model& model, AdamW& optimizer, const StepSettings& settings, double lr,
                      const std::function<ModelInput(int64_t m)>& micro_batch) {
  return step(model, optimizer, settings, lr, micro_batch, nullptr);
}

StepResult train_step(Model& model, AdamW& optimizer, const StepSettings& settings, double lr,
                      const std::function<ModelInput(int64_t m)>& micro_batch, GradientReducer& reducer) {
  return step(model, optimizer, settings, lr, micro_batch, &reducer);
}

}  // namespace hyla
