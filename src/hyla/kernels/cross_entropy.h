#pragma once
// The language-model loss: cross-entropy of rows of logits x [rows, classes], read at a
// temperature τ as s·x with s = 1/τ (`logit_scale`; 1 is the model's own distribution, a policy
// that sampled at τ has s = 1/τ), against target classes t,
//   loss_r = w_r · (lse_r − s·x_r[t_r]),   lse_r = log Σ_j exp(s·x_r[j])
// with w_r = 1 when no weights are given. Rows with t_r < 0 (image positions, padding) carry no
// loss. The log-sum-exp and the loss sum are in double: they add up a vocabulary's worth of
// exponentials and many rows' losses. Rows run in parallel.
#include <cstdint>

namespace hyla {

// targets [rows]; weights [rows] or nullptr. Returns Σ_r loss_r.
double cross_entropy_loss(const float* logits, int64_t rows, int64_t classes, const int32_t* targets,
                          const float* weights, float logit_scale = 1.0f);

// The same sum, and overwrites the logits with the gradient of grad_scale · Σ_r loss_r:
//   x_r ← s · (softmax(s·x_r) − onehot(t_r)) · grad_scale · w_r,   and 0 in rows without a target.
double cross_entropy_loss_and_gradient(float* logits, int64_t rows, int64_t classes, const int32_t* targets,
                                       const float* weights, float grad_scale, float logit_scale = 1.0f);

}  // namespace hyla
