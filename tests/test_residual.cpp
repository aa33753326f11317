// The residual stream's kernels (kernels/residual.h): one f32 operation per element, so the
// results equal the reference's (tests/reference_ops.h) exactly, with and without a base, in
// place, and over enough rows that they run in parallel.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "hyla/kernels/residual.h"
#include "reference_ops.h"

namespace hyla {
namespace {

std::vector<float> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

class Residual : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(Residual, AddRows) {
  const auto [rows, cols] = GetParam();
  const std::vector<float> x = random_vector(rows * cols, 1), base = random_vector(rows * cols, 2);
  std::vector<float> y(x.size(), -1.0f), sum(x.size());
  reference::add_rows(x.data(), base.data(), rows, cols, sum.data());
  add_rows(x.data(), base.data(), rows, cols, y.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], sum[i]) << i;
  add_rows(x.data(), nullptr, rows, cols, y.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], x[i]) << i;
  std::vector<float> in_place = x;
  add_rows(in_place.data(), base.data(), rows, cols, in_place.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(in_place[i], sum[i]) << i;
}

TEST_P(Residual, AccumulateRows) {
  const auto [rows, cols] = GetParam();
  const std::vector<float> x = random_vector(rows * cols, 3), y0 = random_vector(rows * cols, 4);
  std::vector<float> y = y0, sum(y0.size());
  reference::add_rows(x.data(), y0.data(), rows, cols, sum.data());
  accumulate_rows(x.data(), rows, cols, y.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], sum[i]) << i;
}

// A single decode row, an odd block, and 300 × 64 ≥ kParallelGrain (core/threads.h): parallel rows.
INSTANTIATE_TEST_SUITE_P(Shapes, Residual,
                         ::testing::Values(std::pair<int64_t, int64_t>{1, 7}, std::pair<int64_t, int64_t>{13, 33},
                                           std::pair<int64_t, int64_t>{300, 64}));

}  // namespace
}  // namespace hyla
