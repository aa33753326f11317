// The KDA mixer's pointwise kernels (kernels/kda_gates.h, SPEC §3): the prepare step (silu, per-head
// L2 norms, the decay gate in both forms, β) and the output gate, forward against the double-precision
// reference (tests/reference_ops.h), backward against central differences of that reference.
// Sizes are odd (head widths off the 16-lane vectors, a partial 16-column block) and one case is large
// enough that the row loops run in parallel. The kernels read their logits and write their
// gradients inside the rows of a fused projection, so the tests lay them out that way and check
// that the columns belonging to other kernels are left alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hyla/core/threads.h"
#include "hyla/kernels/kda_gates.h"
#include "reference_ops.h"
#include "test_util.h"

namespace hyla {
namespace {

using Doubles = std::vector<double>;

// f32 values held as doubles: the kernel and the reference see the same inputs.
Doubles random_doubles(int64_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  const std::vector<float> f = test::normal_floats(n, seed, stddev, mean);
  return {f.begin(), f.end()};
}

// Worst |got − want| over the largest |want|: every value here is an f32 result of a few roundings
// (~1e-7 relative) off the double reference; 1e-5 leaves margin, a wrong formula is off by O(1).
void expect_close(const float* got, const Doubles& want, const std::string& what) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_LE(worst, 1e-5 * std::max(scale, 1e-3)) << what << ": worst error " << worst << " at scale " << scale;
}

void expect_nonzero_gradients(const std::string& what, const std::function<double()>& loss, Doubles& x,
                              const std::function<double(int64_t)>& analytic, const std::vector<int64_t>& entries) {
  EXPECT_GT(test::expect_gradients(what, loss, x, analytic, entries), 0.0) << what;
}

constexpr int64_t kEveryEntry = INT64_MAX;

// `count` distinct entries of [0, n) at random, or all of them.
std::vector<int64_t> entries_of(int64_t n, int64_t count, uint32_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (count >= n) return all;
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(size_t(count));
  return all;
}

// ---- prepare ----

// The fused projection's row layout [q k v f g b] plus padding: f at 3HK, b at 5HK.
struct Layout {
  int64_t N, H, K;
  int64_t HK() const { return H * K; }
  int64_t ld() const { return 5 * HK() + H + 3; }
  int64_t f_col() const { return 3 * HK(); }
  int64_t b_col() const { return 5 * HK(); }
};

struct PrepareInputs {
  Doubles conv, proj, a_log, dt_bias;  // conv [N, 3HK], proj [N, ld] (only f and b are read)
};

reference::KdaPreparedDouble reference_prepare(const Layout& s, bool bounded, double lb, const PrepareInputs& in) {
  return reference::kda_prepare({s.N, s.H, s.K, s.ld()}, bounded, lb,
                                {in.conv.data(), in.proj.data() + s.f_col(), in.proj.data() + s.b_col(),
                                 in.a_log.data(), in.dt_bias.data()});
}

std::vector<float> to_float(const Doubles& v) { return {v.begin(), v.end()}; }

void check_prepare(const Layout& s, bool bounded, int64_t fd_entries) {
  const int64_t N = s.N, H = s.H, HK = s.HK(), ld = s.ld();
  const float lb = -5.0f;
  const std::string what = std::string(bounded ? "lower-bound" : "softplus") + " N=" + std::to_string(N) +
                           " H=" + std::to_string(H) + " K=" + std::to_string(s.K);
  // Unit-normal logits, A_log ~ N(0.3, 0.5²) and dt_bias ~ N(−1, 0.5²) keep a·z within a few units:
  // both gates run through their curved part, neither saturates.
  PrepareInputs in{random_doubles(3 * HK * N, 1), random_doubles(ld * N, 2), random_doubles(H, 3, 0.5f, 0.3f),
                   random_doubles(HK, 4, 0.5f, -1.0f)};
  const std::vector<float> conv = to_float(in.conv), proj = to_float(in.proj), a_log = to_float(in.a_log),
                           dt_bias = to_float(in.dt_bias);
  const KdaPrepareShape shape{N, H, s.K, ld};
  const KdaDecayGate gate{bounded, lb, a_log.data(), dt_bias.data()};
  const KdaPrepareInputs kin{conv.data(), proj.data() + s.f_col(), proj.data() + s.b_col()};

  // Every output is overwritten: -1 fills show any entry left unwritten.
  std::vector<float> q(size_t(N * HK), -1.0f), k(q), v(q), g(q), inv_norm(size_t(N * 2 * H), -1.0f),
      beta(size_t(N * H), -1.0f);
  const KdaPrepared out{q.data(), k.data(), v.data(), inv_norm.data(), g.data(), beta.data()};
  kda_prepare_forward(shape, gate, kin, out);
  const reference::KdaPreparedDouble ref = reference_prepare(s, bounded, lb, in);
  expect_close(q.data(), ref.q, what + " q");
  expect_close(k.data(), ref.k, what + " k");
  expect_close(v.data(), ref.v, what + " v");
  expect_close(inv_norm.data(), ref.inv_norm, what + " inv_norm");
  expect_close(g.data(), ref.g, what + " g");
  expect_close(beta.data(), ref.beta, what + " beta");

  // L = Σ R ⊙ (q, k, v, g, β): the R are the upstream gradients.
  const std::vector<float> Rq = test::normal_floats(N * HK, 11), Rk = test::normal_floats(N * HK, 12),
                           Rv = test::normal_floats(N * HK, 13), Rg = test::normal_floats(N * HK, 14),
                           Rb = test::normal_floats(N * H, 15);
  const KdaPrepareGrads grads{Rq.data(), Rk.data(), Rv.data(), Rg.data(), Rb.data()};
  // The gradients land in a fused-projection gradient: d_conv in [0, 3HK), df at 3HK, db at 5HK.
  // Those are overwritten (-1 fill); the output gate's columns [4HK, 5HK) and the padding are
  // another kernel's and must keep their sentinel. The parameter gradients are added to.
  constexpr float kSentinel = 7.0f;
  std::vector<float> dproj(size_t(N * ld), kSentinel);
  for (int64_t r = 0; r < N; ++r) {
    std::fill_n(dproj.begin() + r * ld, 4 * HK, -1.0f);
    std::fill_n(dproj.begin() + r * ld + s.b_col(), H, -1.0f);
  }
  constexpr float kPrior = 0.25f;
  std::vector<float> d_a_log(size_t(H), kPrior), d_dt_bias(size_t(HK), kPrior);
  kda_prepare_backward(shape, gate, kin, out, grads,
                       {dproj.data(), dproj.data() + s.f_col(), dproj.data() + s.b_col(), d_a_log.data(),
                        d_dt_bias.data()});
  int64_t changed = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const bool theirs = (c >= 4 * HK && c < s.b_col()) || c >= s.b_col() + H;
      changed += theirs && dproj[size_t(r * ld + c)] != kSentinel;
    }
  EXPECT_EQ(changed, 0) << what << ": wrote outside its columns";

  auto loss = [&]() {
    const reference::KdaPreparedDouble y = reference_prepare(s, bounded, lb, in);
    double l = 0.0;
    for (int64_t i = 0; i < N * HK; ++i)
      l += Rq[size_t(i)] * y.q[size_t(i)] + Rk[size_t(i)] * y.k[size_t(i)] + Rv[size_t(i)] * y.v[size_t(i)] +
           Rg[size_t(i)] * y.g[size_t(i)];
    for (int64_t i = 0; i < N * H; ++i) l += Rb[size_t(i)] * y.beta[size_t(i)];
    return l;
  };
  // conv: entry r·3HK + c ↔ d_conv at dproj[r·ld + c].
  expect_nonzero_gradients(what + " d_conv", loss, in.conv,
                   [&](int64_t i) { return dproj[size_t(i / (3 * HK) * ld + i % (3 * HK))]; },
                   entries_of(N * 3 * HK, fd_entries, 21));
  std::vector<int64_t> f_entries, b_entries;
  for (int64_t i : entries_of(N * HK, fd_entries, 22)) f_entries.push_back(i / HK * ld + s.f_col() + i % HK);
  for (int64_t i : entries_of(N * H, fd_entries, 23)) b_entries.push_back(i / H * ld + s.b_col() + i % H);
  expect_nonzero_gradients(what + " df", loss, in.proj, [&](int64_t i) { return dproj[size_t(i)]; }, f_entries);
  expect_nonzero_gradients(what + " db", loss, in.proj, [&](int64_t i) { return dproj[size_t(i)]; }, b_entries);
  expect_nonzero_gradients(what + " d A_log", loss, in.a_log, [&](int64_t i) { return d_a_log[size_t(i)] - kPrior; },
                   entries_of(H, kEveryEntry, 0));
  expect_nonzero_gradients(what + " d dt_bias", loss, in.dt_bias,
                   [&](int64_t i) { return d_dt_bias[size_t(i)] - kPrior; }, entries_of(HK, kEveryEntry, 0));
}

TEST(KdaGates, PrepareLowerBoundGate) { check_prepare({7, 3, 5}, true, kEveryEntry); }
TEST(KdaGates, PrepareSoftplusGate) { check_prepare({7, 3, 5}, false, kEveryEntry); }
// 21 columns per plane: one full 16-lane vector and a masked tail, two 16-column blocks for dt_bias.
TEST(KdaGates, PrepareOddHeadWidth) {
  check_prepare({5, 1, 21}, true, kEveryEntry);
  check_prepare({5, 1, 21}, false, kEveryEntry);
}
// N·3HK = 57600 ≥ kParallelGrain: the forward's rows run in parallel too.
TEST(KdaGates, PrepareRowsInParallel) {
  ASSERT_TRUE(worth_parallel(300 * 3 * 2 * 32));
  check_prepare({300, 2, 32}, true, 64);
  check_prepare({300, 2, 32}, false, 64);
}

// ---- output gate ----

Doubles reference_output_gate(const Doubles& normed, const Doubles& logits, int64_t ld, int64_t rows, int64_t width) {
  Doubles out(size_t(rows * width));
  reference::kda_output_gate_forward(normed.data(), logits.data(), ld, rows, width, out.data());
  return out;
}

void check_output_gate(int64_t rows, int64_t width, bool in_place) {
  const int64_t ld = width + 5;  // the gate logits are columns of wider rows
  const std::string what = "output gate " + std::to_string(rows) + "x" + std::to_string(width) +
                           (in_place ? " in place" : "");
  Doubles normed_d = random_doubles(rows * width, 31), logits_d = random_doubles(rows * ld, 32, 2.0f);
  const std::vector<float> normed = to_float(normed_d), logits = to_float(logits_d);

  std::vector<float> gated(size_t(rows * width), -1.0f);
  kda_output_gate_forward(normed.data(), logits.data(), ld, rows, width, gated.data());
  expect_close(gated.data(), reference_output_gate(normed_d, logits_d, ld, rows, width), what + " forward");

  const std::vector<float> R = test::normal_floats(rows * width, 33);
  std::vector<float> d_gated(R), d_normed_separate(size_t(rows * width), -1.0f);
  float* d_normed = in_place ? d_gated.data() : d_normed_separate.data();
  constexpr float kSentinel = 7.0f;
  std::vector<float> d_logits(size_t(rows * ld), kSentinel);
  for (int64_t r = 0; r < rows; ++r) std::fill_n(d_logits.begin() + r * ld, width, -1.0f);
  kda_output_gate_backward(normed.data(), logits.data(), ld, rows, width, d_gated.data(), d_normed, d_logits.data());
  int64_t changed = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = width; c < ld; ++c) changed += d_logits[size_t(r * ld + c)] != kSentinel;
  EXPECT_EQ(changed, 0) << what << ": wrote past the gate columns";

  auto loss = [&]() {
    const Doubles y = reference_output_gate(normed_d, logits_d, ld, rows, width);
    double l = 0.0;
    for (size_t i = 0; i < y.size(); ++i) l += R[i] * y[i];
    return l;
  };
  expect_nonzero_gradients(what + " d_normed", loss, normed_d, [&](int64_t i) { return d_normed[i]; },
                   entries_of(rows * width, 300, 34));
  std::vector<int64_t> gate_entries;
  for (int64_t i : entries_of(rows * width, 300, 35)) gate_entries.push_back(i / width * ld + i % width);
  expect_nonzero_gradients(what + " d_logits", loss, logits_d, [&](int64_t i) { return d_logits[size_t(i)]; },
                   gate_entries);
}

TEST(KdaGates, OutputGate) {
  check_output_gate(9, 15, false);
  check_output_gate(9, 15, true);
}
TEST(KdaGates, OutputGateRowsInParallel) {
  ASSERT_TRUE(worth_parallel(200 * 96));
  check_output_gate(200, 96, false);
  check_output_gate(200, 96, true);
}

}  // namespace
}  // namespace hyla
