// RoPE kernel (kernels/rope.h): the SPEC §4 rotation, its inverse as the backward, strided layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "hyla/kernels/rope.h"
#include "reference_ops.h"

namespace hyla {
namespace {

TEST(Rope, RotatesPairsByPositionTimesFrequency) {
  const int64_t rows = 4, heads = 3, dim = 8;
  const double theta = 10000.0;
  const std::vector<int64_t> positions = {0, 1, 777, (int64_t(1) << 20) - 1};
  std::vector<float> table(size_t(rows * dim)), x(size_t(rows * heads * dim)), y(x.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& e : x) e = normal(rng);
  rope_table(positions.data(), rows, dim, theta, table.data());
  rope_forward(table.data(), rows, heads, dim, x.data(), {heads * dim, dim}, y.data(), {heads * dim, dim});
  std::vector<float> reference_table(table.size()), expected(y.size());
  reference::rope_table(positions.data(), rows, dim, theta, reference_table.data());
  reference::rope_forward(reference_table.data(), rows, heads, dim, x.data(), {heads * dim, dim}, expected.data(),
                          {heads * dim, dim});
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-6) << i;
}

TEST(Rope, BackwardIsTheTransposeAndWorksInPlaceOnStridedRows) {
  const int64_t rows = 5, heads = 2, dim = 6, ld = 20, head_stride = 8;  // gaps between heads and rows
  const std::vector<int64_t> positions = {3, 0, 9, 100, 5000};
  std::vector<float> table(size_t(rows * dim)), x(size_t(rows * ld)), g(x.size()), rx(x.size()), rtg(x.size());
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (float& e : x) e = normal(rng);
  for (float& e : g) e = normal(rng);
  rope_table(positions.data(), rows, dim, 500.0, table.data());
  const HeadLayout layout{ld, head_stride};
  rope_forward(table.data(), rows, heads, dim, x.data(), layout, rx.data(), layout);
  rtg = g;
  rope_backward(table.data(), rows, heads, dim, rtg.data(), layout, rtg.data(), layout);  // in place
  double lhs = 0, rhs = 0;  // <R x, g> = <x, Rᵀ g> over the rotated entries
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < dim; ++i) {
        const size_t at = size_t(r * ld + h * head_stride + i);
        lhs += double(rx[at]) * g[at];
        rhs += double(x[at]) * rtg[at];
      }
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::abs(lhs) + 1e-5);
  std::vector<float> back(x.size());
  rope_backward(table.data(), rows, heads, dim, rx.data(), layout, back.data(), layout);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < dim; ++i) {
        const size_t at = size_t(r * ld + h * head_stride + i);
        EXPECT_NEAR(back[at], x[at], 1e-5);
      }
}

}  // namespace
}  // namespace hyla
