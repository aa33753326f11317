// KDA kernels: chunked paths vs the recurrence, backward vs finite differences of a
// double-precision reference, continuation, decode, adversarial decays, thread independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <vector>

#include "hyla/kernels/kda.h"
#include "reference_ops.h"

namespace hyla {
namespace {

// Pointers to consecutive [H, K, V] states of a flat vector.
std::vector<float*> states_of(std::vector<float>& flat, int64_t batch, const KdaShape& shape) {
  return kda_state_pointers(flat.data(), batch, shape);
}

struct Problem {
  KdaShape shape;
  std::vector<int64_t> starts;
  std::vector<float> q, k, v, g, beta, s0;
  std::vector<float*> s0_states;  // into s0
  int64_t rows() const { return starts.back(); }
  int64_t batch() const { return int64_t(starts.size()) - 1; }
  KdaInputs inputs() const {
    return {batch(), starts.data(), q.data(), k.data(), v.data(), g.data(), beta.data(), s0_states.data()};
  }
};

enum class Gate { LowerBound, Softplus, AtBound };

Problem make_problem(int64_t H, int64_t K, int64_t V, std::vector<int64_t> lengths, Gate gate, unsigned seed,
                     float lb = -5.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Problem p{{H, K, V}, {0}, {}, {}, {}, {}, {}, {}, {}};
  for (int64_t n : lengths) p.starts.push_back(p.starts.back() + n);
  const int64_t N = p.rows();
  auto unit_rows = [&](std::vector<float>& x, float scale) {
    x.resize(size_t(N * H * K));
    for (int64_t r = 0; r < N * H; ++r) {
      double norm = 0;
      for (int64_t c = 0; c < K; ++c) norm += std::pow(x[r * K + c] = normal(rng), 2);
      for (int64_t c = 0; c < K; ++c) x[r * K + c] = float(x[r * K + c] / std::sqrt(norm + 1e-6) * scale);
    }
  };
  unit_rows(p.q, 1.0f / std::sqrt(float(K)));
  unit_rows(p.k, 1.0f);
  p.v.resize(size_t(N * H * V));
  for (float& x : p.v) x = normal(rng);
  p.g.resize(size_t(N * H * K));
  for (float& x : p.g) {
    const float z = normal(rng) * 2.0f;
    if (gate == Gate::LowerBound) x = lb / (1.0f + std::exp(-z));
    else if (gate == Gate::AtBound) x = lb;
    else x = -std::exp(normal(rng) * 1.5f) * std::log1p(std::exp(z));  // softplus gate, unbounded
  }
  p.beta.resize(size_t(N * H));
  for (float& x : p.beta) x = 1.0f / (1.0f + std::exp(-normal(rng)));
  p.s0.resize(size_t(p.batch() * H * K * V));
  for (float& x : p.s0) x = 0.3f * normal(rng);
  p.s0_states = states_of(p.s0, p.batch(), p.shape);
  return p;
}

std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

reference::KdaDoubleInputs doubles(const Problem& p) {
  return {to_double(p.q), to_double(p.k), to_double(p.v), to_double(p.g), to_double(p.beta), to_double(p.s0)};
}

struct Output {
  std::vector<float> o, s;
  float max_dense_exponent = 0.0f;
};

Output run_forward(const Problem& p, KdaOptions options, KdaSavedStates* saved = nullptr,
                   Workspace* workspace = nullptr) {
  Workspace local;
  Output out{std::vector<float>(size_t(p.rows() * p.shape.heads * p.shape.value_dim)),
             std::vector<float>(p.s0.size())};
  const auto finals = states_of(out.s, p.batch(), p.shape);
  out.max_dense_exponent =
      kda_forward(p.shape, p.inputs(), options, out.o.data(), finals.data(), saved, workspace ? *workspace : local);
  return out;
}

// max |a - b| / max |b|.
template <typename A, typename B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

bool all_finite(const std::vector<float>& x) {
  for (float v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

KdaOptions options(KdaPath path, int64_t chunk = 64, bool bf16 = false) {
  KdaOptions o;
  o.path = path;
  o.chunk_size = chunk;
  o.bf16_matmul = bf16;
  return o;
}

TEST(Kda, RecurrentMatchesDoubleReference) {
  const Problem p = make_problem(2, 16, 24, {37, 1, 70}, Gate::LowerBound, 1);
  std::vector<double> o, s;
  reference::kda_recurrence(p.shape, p.batch(), p.starts.data(), doubles(p), o, s);
  const Output r = run_forward(p, options(KdaPath::Recurrent));
  EXPECT_LT(relative_error(r.o, o), 1e-5);
  EXPECT_LT(relative_error(r.s, s), 1e-5);
}

TEST(Kda, ChunkedMatchesRecurrentAcrossShapes) {
  struct Case {
    int64_t H, K, V;
    std::vector<int64_t> lengths;
    int64_t chunk;
  };
  const Case cases[] = {
      {2, 32, 32, {100}, 64},        // not a multiple of the chunk
      {1, 16, 16, {1}, 64},          // T = 1
      {3, 32, 48, {37, 1, 130, 64}, 64},  // a batch of different lengths, K != V
      {2, 64, 16, {77}, 16},         // one sub-chunk per chunk
      {1, 24, 40, {300}, 128},       // long chunks, dims not multiples of 16
      {2, 128, 128, {150}, 64},      // the large head shape
  };
  for (const Case& c : cases)
    for (Gate gate : {Gate::LowerBound, Gate::AtBound, Gate::Softplus}) {
      const Problem p = make_problem(c.H, c.K, c.V, c.lengths, gate, unsigned(c.K * 7 + c.V));
      const Output r = run_forward(p, options(KdaPath::Recurrent, c.chunk));
      for (KdaPath path : {KdaPath::ChunkedDense, KdaPath::ChunkedPairwise}) {
        if (gate == Gate::Softplus && path == KdaPath::ChunkedDense) continue;  // needs the bound
        const Output x = run_forward(p, options(path, c.chunk));
        EXPECT_LT(relative_error(x.o, r.o), 1e-4) << to_string(path) << " K=" << c.K << " gate=" << int(gate);
        EXPECT_LT(relative_error(x.s, r.s), 1e-4) << to_string(path) << " K=" << c.K << " gate=" << int(gate);
      }
    }
}

// bf16 matmul inputs: each product's inputs carry a relative rounding error of at most 2^-9;
// a chunk chains about four products (Ã/P, T·X, W·S0, P·E/Kᵀ·E), each dot product of length
// n then has a relative error of ~2^-9·sqrt(n) in the worst direction for random signs, so
// outputs land within ~1e-2 of the f32 result relative to their scale. We assert 2e-2.
TEST(Kda, Bf16MatmulInputsStayWithinBound) {
  for (int64_t K : {32, 128}) {
    const Problem p = make_problem(2, K, K, {200, 64}, Gate::LowerBound, 5);
    const Output r = run_forward(p, options(KdaPath::Recurrent));
    for (KdaPath path : {KdaPath::ChunkedDense, KdaPath::ChunkedPairwise}) {
      const Output x = run_forward(p, options(path, 64, true));
      const double err = relative_error(x.o, r.o);
      EXPECT_LT(err, 2e-2) << to_string(path) << " K=" << K;
      EXPECT_LT(relative_error(x.s, r.s), 2e-2) << to_string(path);
      EXPECT_GT(err, 0.0);  // really rounded
    }
  }
}

TEST(Kda, AdversarialDecayAtTheBound) {
  // Every decay at the bound over a long span: decayed factors underflow to zero, exponents
  // inside sub-blocks reach their maximum 15·|lb|.
  for (float lb : {-5.0f, -1.0f}) {
    const Problem p = make_problem(2, 32, 32, {600}, Gate::AtBound, 9, lb);
    Workspace ws;
    const Output r = run_forward(p, options(KdaPath::Recurrent));
    for (KdaPath path : {KdaPath::ChunkedDense, KdaPath::ChunkedPairwise})
      for (bool bf16 : {false, true}) {
        KdaOptions opt = options(path, 64, bf16);
        opt.gate_lower_bound = lb;
        const Output x = run_forward(p, opt, nullptr, &ws);
        EXPECT_TRUE(all_finite(x.o) && all_finite(x.s)) << to_string(path);
        EXPECT_LT(relative_error(x.o, r.o), bf16 ? 2e-2 : 1e-4) << to_string(path);
        if (path == KdaPath::ChunkedDense) {
          EXPECT_LE(x.max_dense_exponent, 15.0f * std::fabs(lb) * (1 + 1e-5f));
          EXPECT_GE(x.max_dense_exponent, 15.0f * std::fabs(lb) * (1 - 1e-3f));
        }
      }
  }
  // The unbounded gate with huge decays: the pairwise path masks before exponentiating.
  Problem p = make_problem(1, 16, 16, {200}, Gate::Softplus, 3);
  for (size_t i = 0; i < p.g.size(); i += 3) p.g[i] = -1000.0f;
  const Output r = run_forward(p, options(KdaPath::Recurrent));
  const Output x = run_forward(p, options(KdaPath::ChunkedPairwise));
  EXPECT_TRUE(all_finite(x.o) && all_finite(x.s));
  EXPECT_LT(relative_error(x.o, r.o), 1e-4);
}

TEST(Kda, ContinuationPrefillInPiecesThenDecode) {
  const Problem full = make_problem(2, 32, 24, {200}, Gate::LowerBound, 21);
  const Output whole = run_forward(full, options(KdaPath::ChunkedDense));
  const int64_t H = 2, K = 32, V = 24;
  // Prefill [0, 37), [37, 128), [128, 190) through different paths, each continuing from the last state.
  std::vector<float> state = full.s0, o(size_t(200 * H * V));
  const int64_t cuts[] = {0, 37, 128, 190};
  const KdaPath paths[] = {KdaPath::ChunkedDense, KdaPath::Recurrent, KdaPath::ChunkedPairwise};
  Workspace ws;
  for (int piece = 0; piece < 3; ++piece) {
    const int64_t a = cuts[piece], n = cuts[piece + 1] - a;
    const int64_t starts[2] = {0, n};
    float* state_pointer = state.data();
    const float* initial = state.data();
    const KdaInputs in{1, starts, full.q.data() + a * H * K, full.k.data() + a * H * K, full.v.data() + a * H * V,
                       full.g.data() + a * H * K, full.beta.data() + a * H, &initial};
    // Continue in place: the final state overwrites the initial one.
    kda_forward(full.shape, in, options(paths[piece]), o.data() + a * H * V, &state_pointer, nullptr, ws);
  }
  float* state_pointer = state.data();
  for (int64_t t = 190; t < 200; ++t)
    kda_decode_step(full.shape, 1, full.q.data() + t * H * K, full.k.data() + t * H * K, full.v.data() + t * H * V,
                    full.g.data() + t * H * K, full.beta.data() + t * H, &state_pointer, o.data() + t * H * V);
  EXPECT_LT(relative_error(o, whole.o), 1e-4);
  EXPECT_LT(relative_error(state, whole.s), 1e-4);
}

TEST(Kda, ResultsDoNotDependOnThreadCount) {
  const Problem p = make_problem(3, 32, 32, {90, 40}, Gate::LowerBound, 4);
  const int threads = omp_get_max_threads();
  for (KdaPath path : {KdaPath::Recurrent, KdaPath::ChunkedDense}) {
    omp_set_num_threads(1);
    const Output one = run_forward(p, options(path));
    omp_set_num_threads(2);
    const Output two = run_forward(p, options(path));
    EXPECT_EQ(one.o, two.o);
    EXPECT_EQ(one.s, two.s);
  }
  omp_set_num_threads(threads);
}

// One (sequence, head) on two threads: its state columns are split across the threads, and the
// backward sums the splits' partial gradients.
TEST(Kda, ColumnSplitsForFewHeadsMatchOneThread) {
  const Problem p = make_problem(1, 32, 40, {150}, Gate::LowerBound, 8);
  const int threads = omp_get_max_threads();
  for (KdaPath path : {KdaPath::Recurrent, KdaPath::ChunkedDense, KdaPath::ChunkedPairwise}) {
    std::vector<std::vector<float>> results[2];
    for (int n : {1, 2}) {
      omp_set_num_threads(n);
      Workspace ws;
      KdaSavedStates saved;
      std::vector<float> o(size_t(150 * 40)), s(p.s0.size()), d_o(o.size(), 0.5f), d_s(s.size(), -0.25f);
      for (size_t i = 0; i < d_o.size(); ++i) d_o[i] = float(i % 7) - 3.0f;
      const auto finals = states_of(s, 1, p.shape);
      const auto d_finals = states_of(d_s, 1, p.shape);
      kda_forward(p.shape, p.inputs(), options(path, 64), o.data(), finals.data(), &saved, ws);
      std::vector<float> dq(p.q.size()), dk(p.k.size()), dv(p.v.size()), dg(p.g.size()), db(p.beta.size()),
          ds0(p.s0.size());
      const auto d_initials = states_of(ds0, 1, p.shape);
      kda_backward(p.shape, p.inputs(), options(path, 64), d_o.data(), d_finals.data(), saved,
                   {dq.data(), dk.data(), dv.data(), dg.data(), db.data(), d_initials.data()}, ws);
      results[n - 1] = {o, s, dq, dk, dv, dg, db, ds0};
    }
    for (size_t i = 0; i < results[0].size(); ++i)
      EXPECT_LT(relative_error(results[1][i], results[0][i]), 1e-6) << to_string(path) << " output " << i;
  }
  omp_set_num_threads(threads);
}

// Backward vs central finite differences of the double reference, for the loss
// L = Σ o ⊙ Wo + Σ S_final ⊙ Ws with random Wo, Ws.
TEST(Kda, BackwardMatchesFiniteDifferences) {
  const Problem p = make_problem(2, 8, 12, {21, 5, 40}, Gate::LowerBound, 13);
  const int64_t H = 2, V = 12, N = p.rows();
  std::mt19937 rng(99);
  std::normal_distribution<float> normal;
  std::vector<float> Wo(size_t(N * H * V)), Ws(p.s0.size());
  for (float& x : Wo) x = normal(rng);
  for (float& x : Ws) x = normal(rng);
  using Inputs = reference::KdaDoubleInputs;
  const Inputs base = doubles(p);
  auto loss = [&](const Inputs& x) {
    std::vector<double> o, s;
    reference::kda_recurrence(p.shape, p.batch(), p.starts.data(), x, o, s);
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * Wo[i];
    for (size_t i = 0; i < s.size(); ++i) l += s[i] * Ws[i];
    return l;
  };
  for (KdaPath path : {KdaPath::Recurrent, KdaPath::ChunkedDense, KdaPath::ChunkedPairwise}) {
    const KdaOptions opt = options(path, 16);
    Workspace ws;
    KdaSavedStates saved;
    std::vector<float> o(size_t(N * H * V)), s(p.s0.size());
    const auto finals = states_of(s, p.batch(), p.shape);
    kda_forward(p.shape, p.inputs(), opt, o.data(), finals.data(), &saved, ws);
    std::vector<float> dq(p.q.size()), dk(p.k.size()), dv(p.v.size()), dg(p.g.size()), db(p.beta.size()),
        ds0(p.s0.size());
    const auto d_finals = states_of(Ws, p.batch(), p.shape);
    const auto d_initials = states_of(ds0, p.batch(), p.shape);
    kda_backward(p.shape, p.inputs(), opt, Wo.data(), d_finals.data(), saved,
                 {dq.data(), dk.data(), dv.data(), dg.data(), db.data(), d_initials.data()}, ws);
    struct Check {
      const char* name;
      std::vector<double> Inputs::*field;
      const std::vector<float>* grad;
    };
    const Check checks[] = {{"q", &Inputs::q, &dq}, {"k", &Inputs::k, &dk}, {"v", &Inputs::v, &dv},
                            {"g", &Inputs::g, &dg}, {"beta", &Inputs::beta, &db}, {"s0", &Inputs::initial_states, &ds0}};
    for (const Check& c : checks) {
      const std::vector<float>& grad = *c.grad;
      double scale = 0;
      for (float x : grad) scale = std::max(scale, double(std::fabs(x)));
      std::uniform_int_distribution<size_t> pick(0, grad.size() - 1);
      for (int trial = 0; trial < 40; ++trial) {
        const size_t i = trial == 0 ? 0 : trial == 1 ? grad.size() - 1 : pick(rng);
        Inputs plus = base, minus = base;
        const double eps = 1e-5;
        (plus.*c.field)[i] += eps;
        (minus.*c.field)[i] -= eps;
        const double fd = (loss(plus) - loss(minus)) / (2 * eps);
        ASSERT_NEAR(grad[i], fd, 2e-4 * scale + 1e-5) << to_string(path) << " d" << c.name << "[" << i << "]";
      }
    }
  }
}

TEST(Kda, ChunkedBackwardMatchesRecurrentBackward) {
  for (Gate gate : {Gate::LowerBound, Gate::Softplus}) {
    const Problem p = make_problem(2, 64, 48, {150, 33}, gate, 17);
    const int64_t N = p.rows(), H = 2;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    std::vector<float> d_o(size_t(N * H * 48)), d_s(p.s0.size());
    for (float& x : d_o) x = normal(rng);
    for (float& x : d_s) x = normal(rng);
    std::vector<std::vector<float>> reference_grads;
    for (KdaPath path : {KdaPath::Recurrent, KdaPath::ChunkedDense, KdaPath::ChunkedPairwise}) {
      if (gate == Gate::Softplus && path == KdaPath::ChunkedDense) continue;
      Workspace ws;
      KdaSavedStates saved;
      std::vector<float> o(d_o.size()), s(p.s0.size());
      const auto finals = states_of(s, p.batch(), p.shape);
      kda_forward(p.shape, p.inputs(), options(path), o.data(), finals.data(), &saved, ws);
      std::vector<std::vector<float>> g = {std::vector<float>(p.q.size()), std::vector<float>(p.k.size()),
                                           std::vector<float>(p.v.size()), std::vector<float>(p.g.size()),
                                           std::vector<float>(p.beta.size()), std::vector<float>(p.s0.size())};
      const auto d_finals = states_of(d_s, p.batch(), p.shape);
      const auto d_initials = states_of(g[5], p.batch(), p.shape);
      kda_backward(p.shape, p.inputs(), options(path), d_o.data(), d_finals.data(), saved,
                   {g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(), d_initials.data()}, ws);
      if (reference_grads.empty()) {
        reference_grads = g;
        continue;
      }
      const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "ds0"};
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_LT(relative_error(g[i], reference_grads[i]), 1e-4) << to_string(path) << " " << names[i];
    }
  }
}

}  // namespace
}  // namespace hyla
