// The cross-entropy kernels (kernels/cross_entropy.h) against the double-precision reference
// (tests/reference_ops.h): the loss with and without per-row weights (negative and zero ones
// included, as policy gradients use), rows without a target, logits far from 0, and the gradient
// against central differences of the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "hyla/kernels/cross_entropy.h"
#include "reference_ops.h"

namespace hyla {
namespace {

struct Batch {
  int64_t rows, classes;
  std::vector<float> logits;
  std::vector<int32_t> targets;
  std::vector<float> weights;
};

// Rows 0 and 4 have no target; row 2's logits sit near 300 (exp would overflow f32 unshifted).
Batch make_batch(int64_t rows, int64_t classes) {
  Batch b{rows, classes, {}, {}, {}};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t i = 0; i < rows * classes; ++i) b.logits.push_back(normal(rng) + (i / classes == 2 ? 300.0f : 0.0f));
  for (int64_t r = 0; r < rows; ++r) b.targets.push_back(r == 0 || r == 4 ? -1 : int32_t(rng() % uint32_t(classes)));
  for (int64_t r = 0; r < rows; ++r) b.weights.push_back(r == 3 ? 0.0f : 0.5f * normal(rng));
  return b;
}

double reference_loss(const std::vector<double>& logits, const Batch& b, bool weighted, float logit_scale = 1.0f) {
  return reference::cross_entropy_loss(logits.data(), b.rows, b.classes, b.targets.data(),
                                       weighted ? b.weights.data() : nullptr, logit_scale);
}

TEST(CrossEntropy, LossMatchesReference) {
  const Batch b = make_batch(9, 37);
  const std::vector<double> x(b.logits.begin(), b.logits.end());
  for (const bool weighted : {false, true}) {
    const float* w = weighted ? b.weights.data() : nullptr;
    const double want = reference_loss(x, b, weighted);
    // The kernel subtracts the row's max in f32 (one rounding of |x − max| ≲ 15: ≤ 1e-6 per row,
    // measured 4e-9 in all) before its double exponentials and sums; a wrong term is off by O(1).
    EXPECT_NEAR(cross_entropy_loss(b.logits.data(), b.rows, b.classes, b.targets.data(), w), want, 1e-6)
        << "weighted " << weighted;
  }
}

TEST(CrossEntropy, NoTargetsNoLoss) {
  Batch b = make_batch(3, 5);
  std::fill(b.targets.begin(), b.targets.end(), -1);
  EXPECT_EQ(cross_entropy_loss(b.logits.data(), b.rows, b.classes, b.targets.data(), nullptr), 0.0);
  std::vector<float> g = b.logits;
  EXPECT_EQ(cross_entropy_loss_and_gradient(g.data(), b.rows, b.classes, b.targets.data(), nullptr, 1.0f), 0.0);
  for (float v : g) EXPECT_EQ(v, 0.0f);
}

// The gradient overwrites the logits: rows without a target become 0, the others
// grad_scale · d(Σ loss)/dx, checked against central differences of the reference in double
// (h = 1e-4 on O(1) logits: truncation ~1e-9). The kernel rounds each entry to f32 once after a
// double softmax: 1e-6 of the largest gradient covers it, a wrong scale or sign does not. The
// logits are read at temperatures 1 and 0.7 (logit_scale 1/0.7, as a policy sampled at 0.7).
TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  const Batch b = make_batch(9, 37);
  const float grad_scale = 0.3f;
  for (const float logit_scale : {1.0f, 1.0f / 0.7f})
  for (const bool weighted : {false, true}) {
    const float* w = weighted ? b.weights.data() : nullptr;
    std::vector<float> g = b.logits;
    const double loss =
        cross_entropy_loss_and_gradient(g.data(), b.rows, b.classes, b.targets.data(), w, grad_scale, logit_scale);
    EXPECT_EQ(loss, cross_entropy_loss(b.logits.data(), b.rows, b.classes, b.targets.data(), w, logit_scale));
    EXPECT_NEAR(loss, reference_loss({b.logits.begin(), b.logits.end()}, b, weighted, logit_scale), 1e-5);
    std::vector<double> x(b.logits.begin(), b.logits.end());
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i], h = 1e-4;
      x[i] = x0 + h;
      const double plus = reference_loss(x, b, weighted, logit_scale);
      x[i] = x0 - h;
      const double minus = reference_loss(x, b, weighted, logit_scale);
      x[i] = x0;
      const double fd = double(grad_scale) * (plus - minus) / (2.0 * h);
      worst = std::max(worst, std::abs(fd - double(g[i])));
      scale = std::max(scale, std::abs(fd));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LE(worst, 1e-6 * scale) << "weighted " << weighted << " logit_scale " << logit_scale << ": worst error "
                                   << worst << " at scale " << scale;
    for (int64_t r : {0, 4})
      for (int64_t j = 0; j < b.classes; ++j) EXPECT_EQ(g[size_t(r * b.classes + j)], 0.0f) << "row " << r;
  }
}

// A row's gradient sums to 0 (softmax sums to 1, minus the one-hot), over rows of a larger
// vocabulary. Each entry is rounded once (6e-8 relative) and the |entries| sum to 2·scale at most,
// so the f32 sum is within ~2e-7 of the row's scale; 1e-5 is ample.
TEST(CrossEntropy, GradientRowsSumToZero) {
  const Batch b = make_batch(256, 301);
  std::vector<float> g = b.logits;
  cross_entropy_loss_and_gradient(g.data(), b.rows, b.classes, b.targets.data(), b.weights.data(), 1.0f);
  for (int64_t r = 0; r < b.rows; ++r) {
    double sum = 0.0, scale = 0.0;
    for (int64_t j = 0; j < b.classes; ++j) {
      sum += g[size_t(r * b.classes + j)];
      scale = std::max(scale, double(std::abs(g[size_t(r * b.classes + j)])));
    }
    EXPECT_LE(std::abs(sum), 1e-5 * scale + 1e-30) << "row " << r;
  }
}

}  // namespace
}  // namespace hyla
