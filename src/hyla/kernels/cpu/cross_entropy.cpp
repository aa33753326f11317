#include "hyla/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace hyla {
namespace {

// One pass per row for both: the gradient needs the row's lse. Writable logits mean the gradient.
template <typename Logits>
double cross_entropy(Logits* logits, int64_t rows, int64_t classes, const int32_t* targets, const float* weights,
                     float grad_scale, float logit_scale) {
  const double s = logit_scale;
  constexpr bool kGradient = !std::is_const_v<Logits>;
  double loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss)
  for (int64_t i = 0; i < rows; ++i) {
    Logits* row = logits + i * classes;
    const int32_t t = targets[i];
    if (t < 0) {
      if constexpr (kGradient) std::fill(row, row + classes, 0.0f);
      continue;
    }
    float top = row[0];
    for (int64_t j = 1; j < classes; ++j) top = std::max(top, row[j]);
    double sum = 0;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(s * double(row[j] - top));  // s > 0: s·max is the max of s·x
    const double lse = s * double(top) + std::log(sum);
    if (weights) loss += double(weights[i]) * (lse - s * double(row[t]));
    else loss += lse - s * double(row[t]);
    if constexpr (kGradient) {
      const float scale = (weights ? grad_scale * weights[i] : grad_scale) * logit_scale;
      for (int64_t j = 0; j < classes; ++j) row[j] = float(std::exp(s * double(row[j]) - lse)) * scale;
      row[t] -= scale;
    }
  }
  return loss;
}

}  // namespace

double cross_entropy_loss(const float* logits, int64_t rows, int64_t classes, const int32_t* targets,
                          const float* weights, float logit_scale) {
  return cross_entropy(logits, rows, classes, targets, weights, 0.0f, logit_scale);
}

double cross_entropy_loss_and_gradient(float* logits, int64_t rows, int64_t classes, const int32_t* targets,
                                       const float* weights, float grad_scale, float logit_scale) {
  return cross_entropy(logits, rows, classes, targets, weights, grad_scale, logit_scale);
}

}  // namespace hyla
