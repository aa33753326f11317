#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/kernels/attention.h"
#include "hyla/kernels/cpu/vec.h"
#include "reference_ops.h"

namespace hyla {
namespace {

// A packed batch: sequence b has q_lens[b] queries (its last tokens) over kv_lens[b] keys.
struct Problem {
  AttentionDims dims;
  std::vector<int64_t> q_starts{0}, k_starts{0};
  std::vector<float> q, k, v, d_o;

  Problem(AttentionDims d, const std::vector<int64_t>& q_lens, const std::vector<int64_t>& kv_lens, uint32_t seed = 7)
      : dims(d) {
    for (size_t b = 0; b < q_lens.size(); ++b) {
      q_starts.push_back(q_starts.back() + q_lens[b]);
      k_starts.push_back(k_starts.back() + kv_lens[b]);
    }
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    auto fill = [&](std::vector<float>& x, int64_t n) {
      x.resize(size_t(n));
      for (float& e : x) e = dist(rng);
    };
    fill(q, nq() * d.heads * d.qk_dim);
    fill(k, nk() * d.heads * d.qk_dim);
    fill(v, nk() * d.heads * d.v_dim);
    fill(d_o, nq() * d.heads * d.v_dim);
  }
  int64_t batch() const { return int64_t(q_starts.size()) - 1; }
  int64_t nq() const { return q_starts.back(); }
  int64_t nk() const { return k_starts.back(); }
};

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

Outputs run_kernel(const Problem& p, Workspace& ws) {
  const AttentionDims& d = p.dims;
  Outputs r;
  r.o.assign(size_t(p.nq() * d.heads * d.v_dim), NAN);  // NaN: any element left unwritten shows up
  r.lse.assign(size_t(p.nq() * d.heads), NAN);
  r.dq.assign(size_t(p.nq() * d.heads * d.qk_dim), NAN);
  r.dk.assign(size_t(p.nk() * d.heads * d.qk_dim), NAN);
  r.dv.assign(size_t(p.nk() * d.heads * d.v_dim), NAN);
  attention_forward(d, p.batch(), p.q_starts.data(), p.k_starts.data(), p.q.data(), p.k.data(), p.v.data(),
                    r.o.data(), r.lse.data(), ws);
  attention_backward(d, p.batch(), p.q_starts.data(), p.k_starts.data(), p.q.data(), p.k.data(), p.v.data(),
                     r.o.data(), r.lse.data(), p.d_o.data(), r.dq.data(), r.dk.data(), r.dv.data(), ws);
  return r;
}

Outputs run_kernel(const Problem& p) {
  Workspace ws;
  return run_kernel(p, ws);
}

// The reference (tests/reference_ops.h): full softmax per query row in double, and its analytic
// gradient for the loss Σ dO ∘ O. Inputs are taken as double so finite differences can perturb them.
using Reference = reference::AttentionDouble;

Reference reference(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, bool gradients) {
  return reference::attention(p.dims, p.batch(), p.q_starts.data(), p.k_starts.data(), q, k, v,
                              gradients ? p.d_o.data() : nullptr);
}

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

Reference reference(const Problem& p, bool gradients = true) {
  return reference(p, to_double(p.q), to_double(p.k), to_double(p.v), gradients);
}

// max |got - want| / max(1, max |want|): the error relative to the output's scale.
double scaled_error(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {  // lse of a query that sees no key
      EXPECT_EQ(got[i], float(want[i])) << "at " << i;
      continue;
    }
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    if (std::isnan(got[i])) err = INFINITY;
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

void check_against_reference(const Problem& p, double tolerance = 1e-5) {
  const Outputs got = run_kernel(p);
  const Reference want = reference(p);
  EXPECT_LE(scaled_error(got.o, want.o), tolerance) << "o";
  EXPECT_LE(scaled_error(got.lse, want.lse), tolerance) << "lse";
  EXPECT_LE(scaled_error(got.dq, want.dq), 4 * tolerance) << "dq";
  EXPECT_LE(scaled_error(got.dk, want.dk), 4 * tolerance) << "dk";
  EXPECT_LE(scaled_error(got.dv, want.dv), 4 * tolerance) << "dv";
}

AttentionDims dims(int64_t heads, int64_t dqk, int64_t dv, int64_t window = 0) {
  return {heads, dqk, dv, window, float(1.0 / std::sqrt(double(dqk)))};
}

TEST(Attention, TrainingLengthsAroundTheTileSize) {
  for (int64_t t : {1, 2, 17, 63, 64, 65, 130, 200}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    check_against_reference(Problem(dims(3, 32, 32), {t}, {t}));
  }
}

TEST(Attention, BatchOfDifferentLengths) {
  check_against_reference(Problem(dims(2, 64, 64), {1, 70, 130, 5, 64}, {1, 70, 130, 5, 64}));
}

TEST(Attention, PrefillOnACache) {
  check_against_reference(Problem(dims(2, 32, 32), {37, 64, 100}, {150, 264, 101}));
  check_against_reference(Problem(dims(2, 32, 32, 50), {37, 64, 100}, {150, 264, 101}));
}

TEST(Attention, BidirectionalWithinEachSequence) {
  AttentionDims d = dims(3, 32, 32);
  d.causal = false;
  for (int64_t t : {1, 17, 64, 65, 200}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    check_against_reference(Problem(d, {t}, {t}));
  }
  check_against_reference(Problem(d, {1, 70, 130, 5}, {1, 70, 130, 5}));
  // The last query sees every key either way; the first sees them all only without the mask.
  Problem p(d, {40}, {40});
  const Outputs both = run_kernel(p);
  p.dims.causal = true;
  const Outputs causal = run_kernel(p);
  const int64_t last = 39 * d.heads * d.v_dim, width = d.heads * d.v_dim;
  EXPECT_TRUE(std::equal(both.o.begin() + last, both.o.begin() + last + width, causal.o.begin() + last));
  EXPECT_NE(both.o[0], causal.o[0]);
}

TEST(Attention, BidirectionalNeedsEqualLengthsAndNoWindow) {
  AttentionDims d = dims(1, 16, 16);
  d.causal = false;
  EXPECT_THROW(run_kernel(Problem(d, {3}, {5})), Error);
  d.window = 4;
  EXPECT_THROW(run_kernel(Problem(d, {5}, {5})), Error);
}

TEST(Attention, DecodeStep) {
  check_against_reference(Problem(dims(4, 32, 32), {1, 1, 1}, {1, 300, 65}));
  check_against_reference(Problem(dims(4, 32, 32, 7), {1, 1, 1}, {1, 300, 65}));
}

TEST(Attention, QueryAndValueWidthsDiffer) {
  check_against_reference(Problem(dims(3, 24, 16), {90, 33}, {90, 40}));
  check_against_reference(Problem(dims(2, 192, 128), {150}, {150}));
  check_against_reference(Problem(dims(2, 16, 24, 5), {70}, {70}));
}

TEST(Attention, SlidingWindows) {
  for (int64_t w : {1, 3, 50, 64, 65, 130, 1000}) {
    SCOPED_TRACE("window=" + std::to_string(w));
    check_against_reference(Problem(dims(2, 32, 32, w), {200, 20}, {200, 20}));
  }
}

TEST(Attention, SharpSoftmaxRescalesCorrectly) {
  // scale 1 with D = 64 gives scores of std ~8: the running max changes often and by a lot.
  AttentionDims d = dims(2, 64, 64);
  d.scale = 1.0f;
  check_against_reference(Problem(d, {300}, {300}), 3e-5);
}

TEST(Attention, QueriesThatSeeNoKey) {
  // q_len > kv_len: the first queries have negative positions. kv_len = 0: nothing to see.
  const Problem p(dims(2, 16, 8), {10, 3, 70}, {4, 0, 0});
  check_against_reference(p);
  const Outputs got = run_kernel(p);
  for (float x : got.dq) ASSERT_FALSE(std::isnan(x));
  EXPECT_EQ(got.lse[0], -INFINITY);
  EXPECT_EQ(got.o[0], 0.0f);
}

// Central differences of the double reference's loss Σ dO ∘ O check the analytic reference
// gradient, and through it the kernel's.
TEST(Attention, GradientsMatchFiniteDifferences) {
  for (int64_t window : {0, 3}) {
    SCOPED_TRACE("window=" + std::to_string(window));
    const Problem p(dims(2, 5, 3, window), {5, 6, 1}, {7, 6, 4}, 11);
    const Outputs got = run_kernel(p);
    const Reference analytic = reference(p);
    std::vector<double> in[3] = {to_double(p.q), to_double(p.k), to_double(p.v)};
    const std::vector<float>* kernel_grad[3] = {&got.dq, &got.dk, &got.dv};
    const std::vector<double>* ref_grad[3] = {&analytic.dq, &analytic.dk, &analytic.dv};
    auto loss = [&] {
      const Reference r = reference(p, in[0], in[1], in[2], false);
      double l = 0;
      for (size_t i = 0; i < r.o.size(); ++i) l += p.d_o[i] * r.o[i];
      return l;
    };
    constexpr double kStep = 1e-5;
    for (int which = 0; which < 3; ++which)
      for (size_t i = 0; i < in[which].size(); ++i) {
        const double x = in[which][i];
        in[which][i] = x + kStep;
        const double up = loss();
        in[which][i] = x - kStep;
        const double down = loss();
        in[which][i] = x;
        const double numeric = (up - down) / (2 * kStep);
        EXPECT_NEAR((*ref_grad[which])[i], numeric, 1e-7) << "input " << which << " element " << i;
        EXPECT_NEAR((*kernel_grad[which])[i], numeric, 2e-5) << "input " << which << " element " << i;
      }
  }
}

// Forward units are independent and each backward (sequence, head) is done by one thread in a
// fixed order, so 1 and 2 threads agree bitwise. With fewer (sequence, head) pairs than threads
// the backward splits a pair's keys into pieces whose dq are summed at the end: a different
// summation order, so dq agrees to rounding only.
TEST(Attention, ThreadCountDoesNotChangeResults) {
  const int saved = omp_get_max_threads();
  for (int64_t heads : {4, 1}) {
    SCOPED_TRACE("heads=" + std::to_string(heads));
    const Problem p(dims(heads, 64, 64, heads == 1 ? 0 : 100), {300, 77}, {300, 100});
    const Problem single(dims(heads, 64, 64), {500}, {500});
    for (const Problem* problem : {&p, &single}) {
      omp_set_num_threads(1);
      const Outputs one = run_kernel(*problem);
      omp_set_num_threads(2);
      const Outputs two = run_kernel(*problem);
      EXPECT_EQ(one.o, two.o);
      EXPECT_EQ(one.lse, two.lse);
      EXPECT_EQ(one.dk, two.dk);
      EXPECT_EQ(one.dv, two.dv);
      if (heads * problem->batch() >= 2) {
        EXPECT_EQ(one.dq, two.dq);
      } else {
        double err = 0;
        for (size_t i = 0; i < one.dq.size(); ++i) err = std::max(err, double(std::abs(one.dq[i] - two.dq[i])));
        EXPECT_LE(err, 1e-6);
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(Attention, WorkspaceStopsGrowing) {
  const Problem p(dims(2, 64, 32, 0), {130, 40}, {130, 60});
  Workspace ws;
  const Outputs first = run_kernel(p, ws);
  const size_t bytes = ws.bytes();
  EXPECT_GT(bytes, 0u);
  const Outputs second = run_kernel(p, ws);
  EXPECT_EQ(ws.bytes(), bytes);
  EXPECT_EQ(first.o, second.o);
  EXPECT_EQ(first.dq, second.dq);
}

// bf16 block products round q, k, v and P to 8 significant bits (relative error up to 2^-9); the
// f32 softmax keeps the result within ~1e-2 of the output scale (measured: ~2e-3).
TEST(Attention, Bf16ProductsForward) {
  auto bf16 = [](AttentionDims d) {
    d.bf16_products = true;
    return d;
  };
  const Problem problems[] = {
      Problem(bf16(dims(3, 32, 32)), {200}, {200}),
      Problem(bf16(dims(2, 7, 5, 3)), {70, 33, 1}, {71, 40, 9}),  // odd widths, lengths and starts
      Problem(bf16(dims(2, 192, 128)), {150}, {150}),
      Problem(bf16(dims(2, 32, 24, 50)), {37, 64, 100}, {150, 264, 101}),
      // Shapes the AMX path takes where the CPU has it (Dqk and Dv multiples of 16): several
      // 256-key softmax steps, a window with key groups cut short, a long cache and a tiny sequence,
      // and Dqk 48 (a score product's last 16 values in shorter tiles: the long-context configs).
      Problem(bf16(dims(4, 64, 64)), {600}, {600}),
      Problem(bf16(dims(2, 64, 32, 100)), {300, 17}, {300, 40}),
      Problem(bf16(dims(1, 32, 16)), {64, 3}, {1000, 3}),
      Problem(bf16(dims(4, 48, 48)), {300, 50}, {300, 400}),
  };
  for (const Problem& p : problems) {
    Workspace ws;
    std::vector<float> o(size_t(p.nq() * p.dims.heads * p.dims.v_dim), NAN), lse(size_t(p.nq() * p.dims.heads), NAN);
    attention_forward(p.dims, p.batch(), p.q_starts.data(), p.k_starts.data(), p.q.data(), p.k.data(), p.v.data(),
                      o.data(), lse.data(), ws);
    const Reference want = reference(p, false);
    const double err_o = scaled_error(o, want.o), err_lse = scaled_error(lse, want.lse);
    EXPECT_LE(err_o, 1e-2);
    EXPECT_LE(err_lse, 1e-2);
    EXPECT_GT(err_o, 1e-6);  // it did round
    std::printf("bf16 products: o error %.2g, lse error %.2g\n", err_o, err_lse);
  }
  std::vector<float> grads(1);
  const Problem& p = problems[0];
  Workspace ws;
  EXPECT_THROW(attention_backward(p.dims, p.batch(), p.q_starts.data(), p.k_starts.data(), p.q.data(), p.k.data(),
                                  p.v.data(), p.q.data(), p.q.data(), p.d_o.data(), grads.data(), grads.data(),
                                  grads.data(), ws),
               Error);
}

TEST(Attention, RejectsBadDims) {
  const int64_t starts[2] = {0, 1};
  float x = 0;
  Workspace ws;
  EXPECT_THROW(attention_forward({0, 8, 8, 0, 1.0f}, 1, starts, starts, &x, &x, &x, &x, &x, ws), Error);
  EXPECT_THROW(attention_forward({1, 8, 8, -1, 1.0f}, 1, starts, starts, &x, &x, &x, &x, &x, ws), Error);
}

// The vectorised exp against std::exp over the arguments attention uses (scores minus their max,
// so <= 0, down to where e^x underflows) and a little above.
TEST(VecExp, MatchesStdExp) {
  std::vector<float> x;
  for (double t = -104.0; t <= 88.0; t += 1.0 / 4096) x.push_back(float(t));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> small(-1e-3f, 1e-3f);
  for (int i = 0; i < 100000; ++i) x.push_back(small(rng));
  while (x.size() % vec::kLanes) x.push_back(0.0f);
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); i += vec::kLanes) {
    float y[vec::kLanes];
    vec::store(y, vec::exp(vec::load(&x[i])));
    for (int j = 0; j < vec::kLanes; ++j) {
      const double want = std::exp(double(x[i + size_t(j)]));
      if (want < double(std::numeric_limits<float>::min())) {  // subnormal results: absolute error
        ASSERT_LE(std::abs(y[j] - want), double(std::numeric_limits<float>::denorm_min())) << x[i + size_t(j)];
        continue;
      }
      const double rel = std::abs(y[j] - want) / want;
      if (rel > worst) worst = rel, worst_x = x[i + size_t(j)];
    }
  }
  EXPECT_LE(worst, 2e-7) << "at x = " << worst_x;

  const float special[vec::kLanes] = {-105.0f, -1e4f, -INFINITY, -std::numeric_limits<float>::max(), 0.0f,
                                      89.0f,   1e4f,  INFINITY,  NAN, -0.0f, 1.0f, -1.0f, 88.7f, -87.3f, 1e-30f, -1e-30f};
  float y[vec::kLanes];
  vec::store(y, vec::exp(vec::load(special)));
  for (int j = 0; j < 4; ++j) EXPECT_EQ(y[j], 0.0f) << special[j];
  EXPECT_EQ(y[4], 1.0f);
  for (int j = 5; j < 8; ++j) EXPECT_EQ(y[j], INFINITY) << special[j];
  EXPECT_TRUE(std::isnan(y[8]));
  EXPECT_EQ(y[9], 1.0f);
  for (int j = 10; j < 16; ++j) EXPECT_NEAR(y[j], std::exp(double(special[j])), 2e-7 * std::exp(double(special[j])));
}

}  // namespace
}  // namespace hyla
