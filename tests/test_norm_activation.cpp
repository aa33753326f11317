// The backward passes of LayerNorm and GELU (a vision tower's, SPEC §7) against central differences
// of double references of their forward passes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hyla/kernels/activations.h"
#include "hyla/kernels/norm.h"
#include "test_util.h"

namespace hyla {
namespace {

using test::expect_gradients;
using test::normal_floats;

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }
std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with bias" : "without bias");
    const int64_t rows = 5, dim = 37, ld = dim + 2;
    const float eps = 1e-5f;
    std::vector<double> x = to_double(normal_floats(rows * ld, 1, 2.0f, 3.0f)), w = to_double(normal_floats(dim, 2)),
                        b = to_double(normal_floats(dim, 3));
    const std::vector<float> dy = normal_floats(rows * dim, 4);
    // loss = Σ dy ⊙ LayerNorm(x) in double.
    auto loss = [&] {
      double total = 0;
      for (int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int64_t j = 0; j < dim; ++j) mean += x[size_t(r * ld + j)];
        mean /= double(dim);
        for (int64_t j = 0; j < dim; ++j) var += std::pow(x[size_t(r * ld + j)] - mean, 2);
        const double inv = 1.0 / std::sqrt(var / double(dim) + eps);
        for (int64_t j = 0; j < dim; ++j)
          total += dy[size_t(r * dim + j)] *
                   ((x[size_t(r * ld + j)] - mean) * inv * w[size_t(j)] + (bias ? b[size_t(j)] : 0.0));
      }
      return total;
    };
    const std::vector<float> xf = to_float(x), wf = to_float(w), bf = to_float(b);
    std::vector<float> y(size_t(rows * dim)), stats(size_t(2 * rows)), dx(size_t(rows * ld), 0.5f), dw(size_t(dim), 0.0f),
        db(size_t(dim), 0.0f);
    layernorm_forward(xf.data(), ld, wf.data(), bias ? bf.data() : nullptr, rows, dim, eps, y.data(), dim, stats.data());
    layernorm_backward(xf.data(), ld, wf.data(), stats.data(), dy.data(), dim, rows, dim, dx.data(), ld, false, dw.data(),
                       bias ? db.data() : nullptr, test::test_workspace());
    std::vector<int64_t> x_entries, w_entries;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j : {int64_t(0), int64_t(17), dim - 1}) x_entries.push_back(r * ld + j);
    for (int64_t j = 0; j < dim; j += 4) w_entries.push_back(j);
    expect_gradients("dx", loss, x, [&](int64_t i) { return dx[size_t(i)]; }, x_entries);
    expect_gradients("dw", loss, w, [&](int64_t i) { return dw[size_t(i)]; }, w_entries);
    if (bias) expect_gradients("db", loss, b, [&](int64_t i) { return db[size_t(i)]; }, w_entries);
    // Accumulating adds the same gradient to what dx held.
    std::vector<float> acc(size_t(rows * ld), 0.5f), unused(size_t(dim), 0.0f);
    layernorm_backward(xf.data(), ld, wf.data(), stats.data(), dy.data(), dim, rows, dim, acc.data(), ld, true,
                       unused.data(), nullptr, test::test_workspace());
    for (int64_t i : x_entries) EXPECT_NEAR(acc[size_t(i)], 0.5f + dx[size_t(i)], 1e-6);
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  for (const Gelu kind : {Gelu::Erf, Gelu::Tanh}) {
    SCOPED_TRACE(kind == Gelu::Erf ? "erf" : "tanh");
    const int64_t n = 3000;  // vectors, a masked tail and pieces in parallel
    std::vector<double> x = to_double(normal_floats(n, 7, 3.0f));
    const std::vector<float> dy = normal_floats(n, 8);
    auto loss = [&] {
      double total = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[size_t(i)];
        total += dy[size_t(i)] * (kind == Gelu::Erf
                                      ? 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))
                                      : 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))));
      }
      return total;
    };
    const std::vector<float> xf = to_float(x);
    std::vector<float> dx = dy;  // in place, as the tower runs it
    gelu_backward(kind, xf.data(), dx.data(), n, dx.data());
    std::vector<int64_t> entries;
    for (int64_t i = 0; i < n; i += 97) entries.push_back(i);
    entries.push_back(n - 1);
    expect_gradients("dx", loss, x, [&](int64_t i) { return dx[size_t(i)]; }, entries);
  }
}

}  // namespace
}  // namespace hyla
