// The cross-backend equivalence test, after llama.cpp's test-backend-ops: every op of the kernel
// interface (hyla/kernels/backend.h) runs in the linked backend (hyla::op) and in the reference
// backend (hyla::reference::op, tests/reference_ops.h) on the same random inputs, and each output
// must agree to max |a − b| / max |b| within the tolerance stated for its op and precision. The
// shapes take odd sizes (tails of the 16-lane vectors and of the kernels' tiles), strided rows,
// packed batches of sequences of different lengths, and bf16 beside f32 wherever an op has a
// precision switch. This is the test a second backend has to pass, unchanged.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "hyla/core/memory.h"
#include "hyla/kernels/attention.h"
#include "hyla/kernels/attn_res.h"
#include "hyla/kernels/balancing.h"
#include "hyla/kernels/backend.h"
#include "hyla/kernels/cpu/vec.h"
#include "hyla/kernels/cross_entropy.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/latent_attention.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/moe.h"
#include "hyla/kernels/norm.h"
#include "hyla/kernels/residual.h"
#include "hyla/kernels/skinny_gemm.h"
#include "hyla/kernels/small_gemm.h"
#include "reference_ops.h"

namespace hyla {
namespace {

enum class Backend { Linked, Reference };

// hyla::op or hyla::reference::op: both take the same arguments, so each case states them once.
#define CALL_OP(backend, op, ...) \
  ((backend) == Backend::Linked ? ::hyla::op(__VA_ARGS__) : ::hyla::reference::op(__VA_ARGS__))

// ---- tolerances, as max |a − b| / max |b| over an output ----

// Sums of many f32 terms (matrix products, softmax sums, the KDA state, on every KDA path): the
// reference's are exact to f32 rounding, a backend's round at every step in its own order,
// ~sqrt(terms)·2^-24 of the output's scale for random signs (measured up to 5e-7 here). A wrong
// index or a dropped term is off by O(1).
constexpr double kF32Sums = 1e-5;
// A few f32 roundings per element, plus vectorised exp and tanh (~1e-7 each; measured up to 6e-7).
constexpr double kF32Elementwise = 1e-5;
// One f32 addition per element: correctly rounded in any IEEE backend, so bit for bit.
constexpr double kExact = 0.0;
// Block products of bf16-rounded operands (8 significant bits, 2^-9 relative) accumulated in f32:
// scores and sums move by a few 2^-9 of their scale (measured up to 5e-3).
constexpr double kBf16Products = 1e-2;
// KDA chains about four such products per chunk, each a dot product of up to 64 terms (measured
// up to 6e-3).
constexpr double kKdaBf16 = 2e-2;
// The loss adds each row's f32-rounded |x − max| terms in double: ≤ 1e-6 per row, far under the
// loss of a row (~log classes; measured up to 2e-9).
constexpr double kLoss = 1e-6;

// ---- cases ----

struct Output {
  const char* name;
  std::vector<double> values;
};
using Outputs = std::vector<Output>;

struct Case {
  std::string shape;
  const char* precision;
  double tolerance;
  std::function<Outputs(Backend)> run;
};

struct Op {
  const char* name;
  std::vector<Case> (*cases)();
};

// Every output buffer starts as this, so that an element a backend leaves unwritten shows.
constexpr float kUnwritten = -7.0f;

std::vector<float> normal(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

template <typename T>
std::vector<T> as(const std::vector<float>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    std::vector<bf16> out(x.size());
    convert(x.data(), out.data(), x.size());
    return out;
  }
}

template <typename T>
const char* input_precision() {
  return std::is_same_v<T, float> ? "f32" : "bf16 inputs";
}

std::vector<double> values(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// max |got − want| / max |want|. An infinite want (the lse of a query that sees no key) must be
// matched exactly; a NaN in got fails.
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    if (std::isinf(want[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

// Row offsets of a packed batch.
std::vector<int64_t> starts_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> starts{0};
  for (int64_t n : lengths) starts.push_back(starts.back() + n);
  return starts;
}

std::string list(const std::vector<int64_t>& lengths) { return fmt::format("{{{}}}", fmt::join(lengths, ",")); }

// ---- matrix products ----

struct GemmShape {
  Trans ta, tb;
  int64_t M, N, K, pad;  // pad: extra columns in each leading dimension
  float alpha, beta;
};

const GemmShape kGemmShapes[] = {
    {Trans::N, Trans::N, 17, 23, 31, 0, 1.0f, 0.0f},  {Trans::N, Trans::T, 64, 48, 80, 3, 1.0f, 0.0f},
    {Trans::T, Trans::N, 33, 65, 129, 1, 0.5f, 1.0f}, {Trans::T, Trans::T, 8, 5, 300, 2, -2.0f, 0.25f},
    {Trans::N, Trans::T, 3, 300, 200, 0, 1.0f, 0.0f},  // x · Wᵀ of ≤ 4 rows: gemm's skinny path
    {Trans::N, Trans::N, 1, 1, 1, 0, 1.0f, 1.0f},
};

template <typename T>
Case gemm_case(const GemmShape& g, int64_t batch, uint32_t seed) {
  const int64_t a_rows = g.ta == Trans::N ? g.M : g.K, a_cols = g.ta == Trans::N ? g.K : g.M;
  const int64_t b_rows = g.tb == Trans::N ? g.K : g.N, b_cols = g.tb == Trans::N ? g.N : g.K;
  const int64_t lda = a_cols + g.pad, ldb = b_cols + g.pad, ldc = g.N + g.pad;
  // Gaps between the matrices of a batch too.
  const int64_t sa = a_rows * lda + 3, sb = b_rows * ldb + 5, sc = g.M * ldc + 1;
  const std::vector<T> A = as<T>(normal(batch * sa, seed)), B = as<T>(normal(batch * sb, seed + 1));
  const std::vector<float> C = normal(batch * sc, seed + 2);
  const std::string shape = fmt::format("M={} N={} K={} {}{} ld+{} alpha={} beta={}{}", g.M, g.N, g.K,
                                        g.ta == Trans::N ? "A" : "Aᵀ", g.tb == Trans::N ? "B" : "Bᵀ", g.pad, g.alpha,
                                        g.beta, batch > 1 ? fmt::format(" batch={}", batch) : "");
  return {shape, input_precision<T>(), kF32Sums, [=](Backend backend) {
            std::vector<float> c = C;
            if (batch == 1)
              CALL_OP(backend, gemm, g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.data(), lda, B.data(), ldb, g.beta,
                      c.data(), ldc);
            else
              CALL_OP(backend, gemm_batched, batch, g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.data(), lda, sa, B.data(),
                      ldb, sb, g.beta, c.data(), ldc, sc);
            return Outputs{{"C", values(c)}};
          }};
}

std::vector<Case> gemm_cases(int64_t batch) {
  std::vector<Case> cases;
  uint32_t seed = 100;
  for (const GemmShape& g : kGemmShapes) {
    cases.push_back(gemm_case<float>(g, batch, seed += 3));
    cases.push_back(gemm_case<bf16>(g, batch, seed += 3));
  }
  return cases;
}

std::vector<Case> single_gemm_cases() { return gemm_cases(1); }
std::vector<Case> batched_gemm_cases() { return gemm_cases(3); }

std::vector<Case> small_gemm_cases() {
  struct Shape {
    bool trans_a;
    int64_t M, N, K;
    float alpha, beta;
  };
  const Shape shapes[] = {{false, 7, 17, 63, 1.0f, 0.0f},
                          {true, 33, 65, 16, -0.5f, 1.0f},
                          {false, 64, 128, 128, 2.0f, 0.75f},
                          {true, 5, 130, 3, 1.0f, 1.0f}};
  std::vector<Case> cases;
  uint32_t seed = 200;
  for (const Shape& s : shapes)
    for (const bool bf16_inputs : {false, true}) {
      const int64_t lda = (s.trans_a ? s.M : s.K) + 3, ldb = s.N + 5, ldc = s.N + 1;
      const std::vector<float> A = normal((s.trans_a ? s.K : s.M) * lda, seed += 3), B = normal(s.K * ldb, seed + 1),
                               C = normal(s.M * ldc, seed + 2);
      const std::string shape = fmt::format("M={} N={} K={} {}B alpha={} beta={}", s.M, s.N, s.K,
                                            s.trans_a ? "Aᵀ" : "A", s.alpha, s.beta);
      // bf16: both backends round the same f32 inputs to bf16, so the products agree as in f32.
      cases.push_back({shape, bf16_inputs ? "bf16 inputs" : "f32", kF32Sums, [=](Backend backend) {
                         std::vector<float> c = C;
                         if (bf16_inputs) {
                           const auto scratch = allocate_aligned(size_t(small_gemm_bf16_scratch(s.M, s.N, s.K)));
                           CALL_OP(backend, small_gemm_bf16, s.trans_a, s.M, s.N, s.K, s.alpha, A.data(), lda,
                                   B.data(), ldb, s.beta, c.data(), ldc, scratch.get());
                         } else {
                           CALL_OP(backend, small_gemm, s.trans_a, s.M, s.N, s.K, s.alpha, A.data(), lda, B.data(),
                                   ldb, s.beta, c.data(), ldc);
                         }
                         return Outputs{{"C", values(c)}};
                       }});
    }
  return cases;
}

template <typename T>
Case skinny_gemm_case(int64_t M, int64_t N, int64_t K, float alpha, float beta, uint32_t seed) {
  const int64_t ldx = K + 3, ldw = K + 5, ldy = N + 7;
  const std::vector<T> x = as<T>(normal(M * ldx, seed)), W = as<T>(normal(N * ldw, seed + 1));
  const std::vector<float> y = normal(M * ldy, seed + 2);
  return {fmt::format("M={} N={} K={} alpha={} beta={}", M, N, K, alpha, beta), input_precision<T>(), kF32Sums,
          [=](Backend backend) {
            std::vector<float> out = y;
            CALL_OP(backend, skinny_gemm, M, N, K, alpha, x.data(), ldx, W.data(), ldw, beta, out.data(), ldy);
            return Outputs{{"y", values(out)}};
          }};
}

std::vector<Case> skinny_gemm_cases() {
  std::vector<Case> cases;
  uint32_t seed = 300;
  for (const auto& [M, N, K, alpha, beta] : {std::tuple{int64_t(1), int64_t(700), int64_t(515), 1.0f, 0.0f},
                                            std::tuple{int64_t(2), int64_t(131), int64_t(257), 0.5f, 1.0f},
                                            std::tuple{int64_t(3), int64_t(5), int64_t(7), -2.0f, 0.25f},
                                            std::tuple{int64_t(4), int64_t(64), int64_t(128), 1.0f, 0.0f}}) {
    cases.push_back(skinny_gemm_case<float>(M, N, K, alpha, beta, seed += 3));
    cases.push_back(skinny_gemm_case<bf16>(M, N, K, alpha, beta, seed += 3));
  }
  return cases;
}

// ---- per-row steps ----

// A single decode row, an odd block, and enough rows × columns that the backend runs rows in parallel.
const std::pair<int64_t, int64_t> kRowShapes[] = {{1, 7}, {13, 33}, {300, 128}};

std::vector<Case> rmsnorm_cases() {
  std::vector<Case> cases;
  uint32_t seed = 400;
  for (const auto& [rows, dim] : kRowShapes) {
    const int64_t ld_x = dim + 3, ld_y = dim + 1;
    const std::vector<float> x = normal(rows * ld_x, seed += 2, 3.0f), w = normal(dim, seed + 1);
    cases.push_back({fmt::format("rows={} dim={} ld_x={} ld_y={}", rows, dim, ld_x, ld_y), "f32", kF32Elementwise,
                     [=](Backend backend) {
                       std::vector<float> y(size_t(rows * ld_y), kUnwritten), rstd(size_t(rows), kUnwritten);
                       CALL_OP(backend, rmsnorm_forward, x.data(), ld_x, w.data(), rows, dim, 1e-6f, y.data(), ld_y,
                               rstd.data());
                       return Outputs{{"y", values(y)}, {"rstd", values(rstd)}};
                     }});
  }
  return cases;
}

std::vector<Case> layernorm_cases() {
  std::vector<Case> cases;
  uint32_t seed = 450;
  for (const auto& [rows, dim] : kRowShapes)
    for (const bool bias : {true, false}) {
      const int64_t ld_x = dim + 3, ld_y = dim + 1;
      // An offset of 5 per row: the mean must come out before the variance.
      std::vector<float> x = normal(rows * ld_x, seed += 3, 3.0f);
      for (float& e : x) e += 5.0f;
      const std::vector<float> w = normal(dim, seed + 1), b = normal(dim, seed + 2);
      cases.push_back({fmt::format("rows={} dim={} ld_x={} ld_y={} bias={}", rows, dim, ld_x, ld_y, bias), "f32",
                       kF32Elementwise, [=](Backend backend) {
                         std::vector<float> y(size_t(rows * ld_y), kUnwritten), stats(size_t(2 * rows), kUnwritten);
                         CALL_OP(backend, layernorm_forward, x.data(), ld_x, w.data(), bias ? b.data() : nullptr, rows,
                                 dim, 1e-5f, y.data(), ld_y, stats.data());
                         return Outputs{{"y", values(y)}, {"stats", values(stats)}};
                       }});
    }
  return cases;
}

std::vector<Case> gelu_cases() {
  std::vector<Case> cases;
  uint32_t seed = 470;
  for (const Gelu kind : {Gelu::Erf, Gelu::Tanh})
    for (const int64_t n : {int64_t(5), int64_t(1000), int64_t(40000)}) {
      const std::vector<float> x = normal(n, ++seed, 3.0f);
      cases.push_back({fmt::format("{} n={}", kind == Gelu::Erf ? "erf" : "tanh", n), "f32", kF32Elementwise,
                       [=](Backend backend) {
                         std::vector<float> y(size_t(n), kUnwritten);
                         CALL_OP(backend, gelu_forward, kind, x.data(), n, y.data());
                         return Outputs{{"y", values(y)}};
                       }});
    }
  return cases;
}

std::vector<Case> gated_activation_cases() {
  std::vector<Case> cases;
  uint32_t seed = 500;
  using Kind = GatedActivation::Kind;
  // SiTU at SPEC's default β = 4, λ = 25, at a smaller β, and with the up branch unbounded (λ = 0).
  // SwiGLU clamped at 3 (Ling 3.0's experts): σ 4 puts both bounds inside the range.
  for (const GatedActivation act : {GatedActivation{Kind::Swiglu}, GatedActivation{Kind::Situ},
                                    GatedActivation{Kind::Situ, 2.0f, 0.0f}, GatedActivation{Kind::Situ, 3.0f, 6.0f},
                                    GatedActivation{Kind::Swiglu, 4.0f, 25.0f, 3.0f}})
    for (const auto& [rows, width] : kRowShapes) {
      // σ 4: the logits reach the curved and saturated parts of tanh(a/β) and σ(a).
      const std::vector<float> gu = normal(rows * 2 * width, ++seed, 4.0f);
      cases.push_back({fmt::format("{} rows={} width={}",
                                   act.kind == Kind::Swiglu
                                       ? fmt::format("swiglu(limit={})", act.swiglu_limit)
                                       : fmt::format("situ(beta={}, linear_beta={})", act.situ_beta, act.situ_linear_beta),
                                   rows, width),
                       "f32", kF32Elementwise, [=](Backend backend) {
                         std::vector<float> h(size_t(rows * width), kUnwritten);
                         CALL_OP(backend, gated_activation_forward, act, gu.data(), rows, width, h.data());
                         return Outputs{{"h", values(h)}};
                       }});
    }
  return cases;
}

std::vector<Case> sigmoid_rows_cases() {
  std::vector<Case> cases;
  uint32_t seed = 550;
  for (const auto& [rows, width] : kRowShapes) {
    const int64_t ld = width + 3;
    const std::vector<float> x = normal(rows * ld, ++seed, 4.0f);
    cases.push_back({fmt::format("rows={} width={} ld={}", rows, width, ld), "f32", kF32Elementwise,
                     [=](Backend backend) {
                       std::vector<float> y = x;  // the gaps between rows stay as they were
                       CALL_OP(backend, sigmoid_rows, y.data(), rows, width, ld);
                       return Outputs{{"y", values(y)}};
                     }});
  }
  return cases;
}

// σ values in (0, 1) with gaps between rows, as sigmoid_rows leaves them in a projection's columns.
std::vector<float> sigmoid_values(int64_t n, uint32_t seed) {
  std::vector<float> s = normal(n, seed, 3.0f);
  for (float& x : s) x = 1.0f / (1.0f + std::exp(-x));
  return s;
}

std::vector<Case> sigmoid_rows_backward_cases() {
  std::vector<Case> cases;
  uint32_t seed = 560;
  for (const auto& [rows, width] : kRowShapes) {
    const int64_t ld_s = width + 5, ld_d = width + 2;
    const std::vector<float> s = sigmoid_values(rows * ld_s, ++seed), d_in = normal(rows * ld_d, seed + 100);
    cases.push_back({fmt::format("rows={} width={} ld_s={} ld_d={}", rows, width, ld_s, ld_d), "f32",
                     kF32Elementwise, [=](Backend backend) {
                       std::vector<float> d = d_in;
                       CALL_OP(backend, sigmoid_rows_backward, s.data(), ld_s, rows, width, d.data(), ld_d);
                       return Outputs{{"d", values(d)}};
                     }});
  }
  return cases;
}

std::vector<Case> sigmoid_gate_cases() {
  std::vector<Case> cases;
  uint32_t seed = 570;
  // One gate per channel, and one per head of 8 (MLA's per-head gate: widths that are whole heads).
  for (const int64_t group : {1, 8})
    for (const auto& [rows, width_in] : kRowShapes) {
      const int64_t width = group == 1 ? width_in : std::max<int64_t>(1, width_in / group) * group;
      const int64_t gates = width / group, ld_s = 2 * gates + 1, ld_logit = gates + 3;
      const std::vector<float> x = normal(rows * width, ++seed), s = sigmoid_values(rows * ld_s, seed + 100),
                               dy_in = normal(rows * width, seed + 200);
      cases.push_back({fmt::format("rows={} width={} group={} ld_s={} ld_logit={}", rows, width, group, ld_s, ld_logit),
                       "f32", kF32Elementwise, [=](Backend backend) {
                         std::vector<float> y(x.size(), kUnwritten), dy = dy_in;
                         std::vector<float> d_logit(size_t(rows * ld_logit), kUnwritten);
                         CALL_OP(backend, sigmoid_gate_forward, x.data(), s.data(), ld_s, rows, width, group, y.data());
                         CALL_OP(backend, sigmoid_gate_backward, x.data(), s.data(), ld_s, rows, width, group,
                                 dy.data(), d_logit.data(), ld_logit);
                         return Outputs{{"y", values(y)}, {"dx", values(dy)}, {"d logit", values(d_logit)}};
                       }});
    }
  return cases;
}

std::vector<Case> rope_cases() {
  struct Shape {
    int64_t heads, dim;
    HeadLayout layout;  // the same for x and y
    double theta;
    std::vector<int64_t> positions;
  };
  std::vector<int64_t> prefill(200);
  for (size_t i = 0; i < prefill.size(); ++i) prefill[i] = int64_t(i) + 3000;
  const Shape shapes[] = {
      {3, 8, {24, 8}, 10000.0, {0, 1, 777, (int64_t(1) << 20) - 1}},  // f32 angles would be off by 0.06 rad
      {2, 6, {20, 8}, 500.0, {3, 0, 9, 100, 5000}},                    // gaps between heads and rows
      {4, 64, {4 * 64, 64}, 10000.0, prefill},                         // rows in parallel
  };
  std::vector<Case> cases;
  uint32_t seed = 600;
  for (const Shape& s : shapes) {
    const int64_t rows = int64_t(s.positions.size()), size = rows * s.layout.row_stride;
    const std::vector<float> x = normal(size, ++seed);
    cases.push_back({fmt::format("rows={} heads={} dim={} row stride={} head stride={} theta={}", rows, s.heads, s.dim,
                                 s.layout.row_stride, s.layout.head_stride, s.theta),
                     "f32", kF32Elementwise, [=](Backend backend) {
                       std::vector<float> table(size_t(rows * s.dim), kUnwritten), y(size_t(size), kUnwritten);
                       CALL_OP(backend, rope_table, s.positions.data(), rows, s.dim, s.theta, table.data());
                       CALL_OP(backend, rope_forward, table.data(), rows, s.heads, s.dim, x.data(), s.layout, y.data(),
                               s.layout);
                       return Outputs{{"table", values(table)}, {"y", values(y)}};
                     }});
  }
  return cases;
}

std::vector<Case> rope_2d_cases() {
  std::vector<Case> cases;
  uint32_t seed = 650;
  // A grid of 3x5 patches, and one of 64x64 (rows in parallel) at MoonViT's head width 72.
  for (const auto& [grid_rows, grid_cols, heads, dim] :
       {std::tuple{int64_t(3), int64_t(5), int64_t(2), int64_t(8)}, std::tuple{int64_t(64), int64_t(64), int64_t(3), int64_t(72)}}) {
    std::vector<int64_t> rows, columns;
    for (int64_t r = 0; r < grid_rows; ++r)
      for (int64_t c = 0; c < grid_cols; ++c) rows.push_back(r), columns.push_back(c);
    const int64_t n = grid_rows * grid_cols;
    const HeadLayout layout{heads * dim, dim};
    const std::vector<float> x = normal(n * heads * dim, ++seed);
    cases.push_back({fmt::format("grid={}x{} heads={} dim={}", grid_rows, grid_cols, heads, dim), "f32",
                     kF32Elementwise, [=](Backend backend) {
                       std::vector<float> table(size_t(n * dim), kUnwritten), y(x.size(), kUnwritten);
                       CALL_OP(backend, rope_table_2d, rows.data(), columns.data(), n, dim, 10000.0, table.data());
                       CALL_OP(backend, rope_forward, table.data(), n, heads, dim, x.data(), layout, y.data(), layout);
                       return Outputs{{"table", values(table)}, {"y", values(y)}};
                     }});
  }
  return cases;
}

std::vector<Case> causal_conv1d_cases() {
  struct Shape {
    int64_t channels, kernel;
    std::vector<int64_t> lengths;
    bool tails;  // a decode cache's previous inputs, else zeros
  };
  const Shape shapes[] = {
      {37, 4, {1, 5, 40}, false}, {37, 4, {1, 5, 40}, true}, {16, 2, {3}, true}, {130, 4, {300}, false},
      // Decode steps (at most 4 rows: the taps read as stored), one with a sequence reading its own
      // earlier row.
      {512, 4, {1}, true}, {37, 4, {1, 1, 2}, true}, {37, 4, {1, 2}, false}};
  std::vector<Case> cases;
  uint32_t seed = 700;
  for (const Shape& s : shapes) {
    const std::vector<int64_t> starts = starts_of(s.lengths);
    const int64_t batch = int64_t(s.lengths.size()), rows = starts.back(), ld_x = s.channels + 5,
                  ld_y = s.channels + 2;
    const std::vector<float> x = normal(rows * ld_x, seed += 3), w = normal(s.channels * s.kernel, seed + 1),
                             tails = normal(batch * (s.kernel - 1) * s.channels, seed + 2);
    cases.push_back({fmt::format("channels={} kernel={} lengths={}{}", s.channels, s.kernel, list(s.lengths),
                                 s.tails ? " with tails" : ""),
                     "f32", kF32Sums, [=](Backend backend) {
                       std::vector<const float*> tail_rows;
                       for (int64_t b = 0; b < batch; ++b)
                         tail_rows.push_back(tails.data() + b * (s.kernel - 1) * s.channels);
                       const Conv1dShape shape{s.channels, s.kernel, batch, starts.data()};
                       std::vector<float> y(size_t(rows * ld_y), kUnwritten);
                       Workspace workspace;
                       CALL_OP(backend, causal_conv1d_forward, shape, x.data(), ld_x, w.data(),
                               s.tails ? tail_rows.data() : nullptr, y.data(), ld_y, workspace);
                       return Outputs{{"y", values(y)}};
                     }});
  }
  return cases;
}

std::vector<Case> add_rows_cases() {
  std::vector<Case> cases;
  uint32_t seed = 800;
  for (const auto& [rows, cols] : kRowShapes)
    for (const bool with_base : {true, false}) {
      const std::vector<float> x = normal(rows * cols, seed += 2), base = normal(rows * cols, seed + 1);
      cases.push_back({fmt::format("rows={} cols={}{}", rows, cols, with_base ? "" : " no base"), "f32", kExact,
                       [=](Backend backend) {
                         std::vector<float> y(x.size(), kUnwritten);
                         CALL_OP(backend, add_rows, x.data(), with_base ? base.data() : nullptr, rows, cols, y.data());
                         return Outputs{{"y", values(y)}};
                       }});
    }
  return cases;
}

// ---- copies between layouts ----

// Head splits as the MLA mixer makes them: a projection's per-head blocks (gaps between heads and
// rows) into packed heads, one vector broadcast to every head ({ld, 0}), and single rows.
struct HeadCopyShape {
  int64_t rows, heads, width;
  HeadLayout src, dst;
};
const HeadCopyShape kHeadCopyShapes[] = {
    {1, 1, 7, {7, 0}, {9, 0}},
    {13, 3, 5, {40, 12}, {15, 5}},
    {300, 4, 16, {100, 24}, {64, 16}},
    {200, 8, 9, {11, 0}, {8 * 24, 24}},  // a shared vector copied to every head
};

// Extent of a layout's elements, so a case allocates every position it may write.
int64_t span_of(const HeadCopyShape& s, HeadLayout layout) {
  return (s.rows - 1) * layout.row_stride + (s.heads - 1) * layout.head_stride + s.width;
}

std::vector<Case> copy_heads_cases() {
  std::vector<Case> cases;
  uint32_t seed = 5850;
  for (const HeadCopyShape& s : kHeadCopyShapes) {
    const std::vector<float> src = normal(span_of(s, s.src), ++seed);
    const std::string shape = fmt::format("rows={} heads={} width={} src=({}, {}) dst=({}, {})", s.rows, s.heads,
                                          s.width, s.src.row_stride, s.src.head_stride, s.dst.row_stride,
                                          s.dst.head_stride);
    cases.push_back({shape, "f32 to bf16", kExact, [=](Backend backend) {
                       std::vector<bf16> dst(size_t(span_of(s, s.dst)), to_bf16(kUnwritten));
                       CALL_OP(backend, copy_heads, src.data(), s.src, s.rows, s.heads, s.width, dst.data(), s.dst);
                       std::vector<double> out;
                       for (bf16 x : dst) out.push_back(to_f32(x));
                       return Outputs{{"dst", out}};
                     }});
    const std::vector<bf16> src16 = as<bf16>(src);
    cases.push_back({shape, "bf16 to f32", kExact, [=](Backend backend) {
                       std::vector<float> dst(size_t(span_of(s, s.dst)), kUnwritten);
                       CALL_OP(backend, copy_heads, src16.data(), s.src, s.rows, s.heads, s.width, dst.data(), s.dst);
                       return Outputs{{"dst", values(dst)}};
                     }});
  }
  for (const HeadCopyShape& s : kHeadCopyShapes) {
    const std::vector<float> src = normal(span_of(s, s.src), ++seed);
    cases.push_back({fmt::format("rows={} heads={} width={} src=({}, {}) dst=({}, {})", s.rows, s.heads, s.width,
                                 s.src.row_stride, s.src.head_stride, s.dst.row_stride, s.dst.head_stride),
                     "f32", kExact, [=](Backend backend) {
                       std::vector<float> dst(size_t(span_of(s, s.dst)), kUnwritten);
                       CALL_OP(backend, copy_heads, src.data(), s.src, s.rows, s.heads, s.width, dst.data(), s.dst);
                       return Outputs{{"dst", values(dst)}};
                     }});
  }
  return cases;
}

std::vector<Case> sum_heads_cases() {
  std::vector<Case> cases;
  uint32_t seed = 5950;
  for (const HeadCopyShape& s : kHeadCopyShapes) {
    if (s.src.head_stride == 0) continue;
    const std::vector<float> src = normal(span_of(s, s.src), ++seed);
    const int64_t dst_stride = s.width + 4;
    cases.push_back({fmt::format("rows={} heads={} width={} src=({}, {}) dst_stride={}", s.rows, s.heads, s.width,
                                 s.src.row_stride, s.src.head_stride, dst_stride),
                     "f32", kF32Sums, [=](Backend backend) {
                       std::vector<float> dst(size_t(s.rows * dst_stride), kUnwritten);
                       CALL_OP(backend, sum_heads, src.data(), s.src, s.rows, s.heads, s.width, dst.data(), dst_stride);
                       return Outputs{{"dst", values(dst)}};
                     }});
  }
  return cases;
}

// Token ids into a table of `vocab` rows, repeats included; −1 (a skipped row) for the scatter.
std::vector<int32_t> token_ids(int64_t n, int64_t vocab, uint32_t seed, bool with_skips) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t j = 0; j < n; ++j) ids.push_back(with_skips && j % 7 == 3 ? -1 : int32_t(rng() % uint32_t(vocab)));
  return ids;
}

std::vector<Case> gather_scatter_rows_cases() {
  std::vector<Case> cases;
  uint32_t seed = 6050;
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{1, 3, 7}, {37, 11, 33}, {600, 50, 130}};  // rows, vocab, width
  for (const auto& [n, vocab, width] : shapes) {
    const std::vector<float> table = normal(vocab * width, ++seed), x = normal(n * width, seed + 100);
    const std::vector<int32_t> ids = token_ids(n, vocab, seed, false), skipping = token_ids(n, vocab, seed, true);
    const std::string shape = fmt::format("rows={} vocab={} width={}", n, vocab, width);
    cases.push_back({shape, "f32", kExact, [=](Backend backend) {
                       std::vector<float> out(size_t(n * width), kUnwritten);
                       CALL_OP(backend, gather_rows, table.data(), width, ids.data(), n, out.data());
                       return Outputs{{"gathered", values(out)}};
                     }});
    cases.push_back({shape + " with -1 ids", "f32", kF32Sums, [=](Backend backend) {
                       std::vector<float> y = table;  // adds to what is there
                       CALL_OP(backend, scatter_add_rows, x.data(), width, skipping.data(), n, y.data());
                       return Outputs{{"scattered", values(y)}};
                     }});
  }
  return cases;
}

// ---- the attention residuals and the MoE ----

struct AttnResShape {
  int64_t count, rows, dim;
};
const AttnResShape kAttnResShapes[] = {{1, 7, 33}, {3, 13, 33}, {5, 300, 128}};

// The sources at different scales (so that their norms differ) and a query that makes the
// softmax uneven.
struct AttnResInputs {
  std::vector<std::vector<float>> sources;
  std::vector<float> query, norm_weight;
  std::vector<const float*> pointers() const {
    std::vector<const float*> p;
    for (const std::vector<float>& s : sources) p.push_back(s.data());
    return p;
  }
};

AttnResInputs attn_res_inputs(const AttnResShape& s, uint32_t seed) {
  AttnResInputs in;
  for (int64_t n = 0; n < s.count; ++n)
    in.sources.push_back(normal(s.rows * s.dim, seed + uint32_t(n), 1.0f + float(n)));
  in.query = normal(s.dim, seed + 100, 0.5f);
  in.norm_weight = normal(s.dim, seed + 101);
  return in;
}

constexpr float kAttnResEps = 1e-5f;

std::vector<Case> attn_res_forward_cases() {
  std::vector<Case> cases;
  uint32_t seed = 850;
  for (const AttnResShape& s : kAttnResShapes) {
    const AttnResInputs in = attn_res_inputs(s, seed += 200);
    cases.push_back({fmt::format("sources={} rows={} dim={}", s.count, s.rows, s.dim), "f32", kF32Sums,
                     [=](Backend backend) {
                       std::vector<float> weights(size_t(s.rows * s.count), kUnwritten),
                           out(size_t(s.rows * s.dim), kUnwritten);
                       Workspace workspace;
                       CALL_OP(backend, attn_res_forward, in.pointers().data(), s.count, s.rows, s.dim,
                               in.query.data(), in.norm_weight.data(), kAttnResEps, weights.data(), out.data(),
                               workspace);
                       return Outputs{{"weights", values(weights)}, {"out", values(out)}};
                     }});
  }
  return cases;
}

// The gradients accumulate: every gradient buffer starts at random values.
std::vector<Case> attn_res_backward_cases() {
  std::vector<Case> cases;
  uint32_t seed = 1850;
  for (const AttnResShape& s : kAttnResShapes) {
    const AttnResInputs in = attn_res_inputs(s, seed += 200);
    std::vector<float> weights(size_t(s.rows * s.count)), out(size_t(s.rows * s.dim));
    Workspace workspace;
    reference::attn_res_forward(in.pointers().data(), s.count, s.rows, s.dim, in.query.data(), in.norm_weight.data(),
                                kAttnResEps, weights.data(), out.data(), workspace);
    const std::vector<float> d_out = normal(s.rows * s.dim, seed + 150),
                             source_grads = normal(s.count * s.rows * s.dim, seed + 151),
                             d_query = normal(s.dim, seed + 152), d_norm_weight = normal(s.dim, seed + 153);
    cases.push_back({fmt::format("sources={} rows={} dim={}", s.count, s.rows, s.dim), "f32", kF32Sums,
                     [=](Backend backend) {
                       std::vector<float> dv = source_grads, dw = d_query, dgamma = d_norm_weight;
                       std::vector<float*> dv_rows;
                       for (int64_t n = 0; n < s.count; ++n) dv_rows.push_back(dv.data() + n * s.rows * s.dim);
                       Workspace scratch;
                       CALL_OP(backend, attn_res_backward, in.pointers().data(), s.count, s.rows, s.dim,
                               in.query.data(), in.norm_weight.data(), kAttnResEps, weights.data(), d_out.data(),
                               dv_rows.data(), dw.data(), dgamma.data(), scratch);
                       return Outputs{
                           {"source grads", values(dv)}, {"d query", values(dw)}, {"d norm weight", values(dgamma)}};
                     }});
  }
  return cases;
}

struct RoutingShape {
  int64_t tokens, experts, k;
};
const RoutingShape kRoutingShapes[] = {{1, 8, 2}, {13, 64, 6}, {300, 37, 4}};

// Router scores σ(logits) and a small balancing bias, as the router makes them.
std::pair<std::vector<float>, std::vector<float>> routing_scores(const RoutingShape& s, uint32_t seed) {
  std::vector<float> scores = normal(s.tokens * s.experts, seed, 2.0f);
  for (float& x : scores) x = 1.0f / (1.0f + std::exp(-x));
  return {scores, normal(s.experts, seed + 1, 0.1f)};
}

// Scores, bias and the reference's top-k of them.
struct Routed {
  std::vector<float> scores, bias, weights;
  std::vector<int32_t> selected;
};
Routed routed(const RoutingShape& s, uint32_t seed) {
  Routed r;
  std::tie(r.scores, r.bias) = routing_scores(s, seed);
  r.selected.resize(size_t(s.tokens * s.k));
  r.weights.resize(size_t(s.tokens * s.k));
  reference::select_experts(r.scores.data(), r.bias.data(), s.tokens, s.experts, s.k, 2.5f, r.selected.data(),
                            r.weights.data());
  return r;
}

// The ids compare exactly: a different choice is off by at least 1 of at most experts − 1.
std::vector<Case> select_experts_cases() {
  std::vector<Case> cases;
  uint32_t seed = 3850;
  for (const RoutingShape& s : kRoutingShapes) {
    const auto [scores, bias] = routing_scores(s, seed += 2);
    cases.push_back({fmt::format("tokens={} experts={} k={}", s.tokens, s.experts, s.k), "f32", kF32Elementwise,
                     [=](Backend backend) {
                       std::vector<int32_t> selected(size_t(s.tokens * s.k), -1);
                       std::vector<float> weights(size_t(s.tokens * s.k), kUnwritten);
                       CALL_OP(backend, select_experts, scores.data(), bias.data(), s.tokens, s.experts, s.k, 2.5f,
                               selected.data(), weights.data());
                       return Outputs{{"selected", {selected.begin(), selected.end()}}, {"weights", values(weights)}};
                     }});
  }
  return cases;
}

std::vector<Case> routing_weights_backward_cases() {
  std::vector<Case> cases;
  uint32_t seed = 4850;
  for (const RoutingShape& s : kRoutingShapes) {
    const auto [scores, bias, weights, selected] = routed(s, seed += 3);
    const std::vector<float> d_weights = normal(s.tokens * s.k, seed + 2);
    cases.push_back({fmt::format("tokens={} experts={} k={}", s.tokens, s.experts, s.k), "f32", kF32Sums,
                     [=](Backend backend) {
                       std::vector<float> d_scores(size_t(s.tokens * s.experts), kUnwritten);
                       CALL_OP(backend, routing_weights_backward, scores.data(), selected.data(), weights.data(),
                               s.tokens, s.experts, s.k, 2.5f, d_weights.data(), d_scores.data());
                       return Outputs{{"d scores", values(d_scores)}};
                     }});
  }
  return cases;
}

std::vector<Case> routed_output_backward_cases() {
  std::vector<Case> cases;
  uint32_t seed = 2850;
  for (const auto& [rows, width] : kRowShapes) {
    const std::vector<float> h = normal(rows * width, seed += 3), routing_weight = normal(rows, seed + 1),
                             dh_in = normal(rows * width, seed + 2);
    cases.push_back({fmt::format("rows={} width={}", rows, width), "f32", kF32Sums, [=](Backend backend) {
                       std::vector<float> dh = dh_in, weighted_h(h.size(), kUnwritten),
                                          d_weight(size_t(rows), kUnwritten);
                       CALL_OP(backend, routed_output_backward, h.data(), routing_weight.data(), rows, width, dh.data(),
                               weighted_h.data(), d_weight.data());
                       return Outputs{
                           {"dh", values(dh)}, {"weighted h", values(weighted_h)}, {"d weight", values(d_weight)}};
                     }});
  }
  return cases;
}

std::vector<Case> combine_expert_rows_cases() {
  std::vector<Case> cases;
  uint32_t seed = 6150;
  for (const RoutingShape& s : kRoutingShapes) {
    const int64_t width = s.experts + 9, slots = s.tokens * s.k;
    const std::vector<float> slot_rows = normal(slots * width, ++seed), slot_weight = normal(slots, seed + 1),
                             y_in = normal(s.tokens * width, seed + 2);
    std::vector<int32_t> token_slot(static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i) token_slot[size_t(i)] = int32_t(i);
    std::shuffle(token_slot.begin(), token_slot.end(), std::mt19937(seed));
    for (const bool weighted : {true, false})
      for (const bool accumulate : {false, true})
        cases.push_back({fmt::format("tokens={} k={} width={}{}{}", s.tokens, s.k, width, weighted ? " weighted" : "",
                                     accumulate ? " accumulate" : ""),
                         "f32", kF32Sums, [=](Backend backend) {
                           std::vector<float> y = accumulate ? y_in : std::vector<float>(y_in.size(), kUnwritten);
                           CALL_OP(backend, combine_expert_rows, slot_rows.data(), width, token_slot.data(),
                                   weighted ? slot_weight.data() : nullptr, s.tokens, s.k, accumulate, y.data());
                           return Outputs{{"y", values(y)}};
                         }});
  }
  return cases;
}

// The quantile rule's margins and thresholds, and the aux loss, on routings select_experts made.
std::vector<Case> balancing_cases() {
  std::vector<Case> cases;
  uint32_t seed = 6250;
  for (const RoutingShape& s : kRoutingShapes) {
    const auto [scores, bias, weights, selected] = routed(s, seed += 3);
    std::vector<int64_t> load(size_t(s.experts), 0);
    for (int32_t e : selected) ++load[size_t(e)];
    std::vector<float> margins(size_t(s.tokens * s.experts));
    reference::quantile_margins(scores.data(), bias.data(), selected.data(), s.tokens, s.experts, s.k, margins.data());
    const int64_t rank = std::min<int64_t>(s.tokens, s.tokens * s.k / s.experts + 1), bins = 64;
    const std::vector<float> d_in = normal(s.tokens * s.experts, seed + 2);
    const std::string shape = fmt::format("tokens={} experts={} k={}", s.tokens, s.experts, s.k);
    cases.push_back({shape, "f32", kF32Elementwise, [=](Backend backend) {
                       std::vector<float> m(margins.size(), kUnwritten);
                       CALL_OP(backend, quantile_margins, scores.data(), bias.data(), selected.data(), s.tokens,
                               s.experts, s.k, m.data());
                       return Outputs{{"margins", values(m)}};
                     }});
    cases.push_back({shape + fmt::format(" rank={} bins={}", rank, bins), "f32", kExact, [=](Backend backend) {
                       std::vector<int64_t> counts(size_t(s.experts * bins), -1);
                       CALL_OP(backend, margin_histograms, margins.data(), s.tokens, s.experts, -1.2f, 2.4f / bins,
                               bins, counts.data());
                       std::vector<float> scratch(margins.size()), kth(size_t(s.experts), kUnwritten);
                       CALL_OP(backend, kth_largest_per_column, margins.data(), s.tokens, s.experts, rank,
                               scratch.data(), kth.data());
                       return Outputs{{"histograms", {counts.begin(), counts.end()}}, {"thresholds", values(kth)}};
                     }});
    cases.push_back({shape, "f32", kF32Sums, [=](Backend backend) {
                       const double sum =
                           CALL_OP(backend, aux_loss_sum, scores.data(), load.data(), s.tokens, s.experts, s.k);
                       std::vector<float> d = d_in;
                       CALL_OP(backend, aux_loss_sum_backward, scores.data(), load.data(), s.tokens, s.experts, s.k,
                               0.7f, d.data());
                       return Outputs{{"aux loss sum", {sum}}, {"d scores", values(d)}};
                     }});
  }
  return cases;
}

// The values compare exactly: both divide by the stored f32 scale.
std::vector<Case> quantize_int8_weights_cases() {
  std::vector<Case> cases;
  uint32_t seed = 6350;
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{1, 16, 16}, {13, 64, 32}, {300, 256, 128}};  // rows, cols, block
  for (const auto& [rows, cols, block] : shapes) {
    std::vector<float> w = normal(rows * cols, ++seed);
    std::fill_n(w.begin(), block, 0.0f);  // an all-zero block: scale 0, values 0
    cases.push_back({fmt::format("rows={} cols={} block={}", rows, cols, block), "f32", kExact, [=](Backend backend) {
                       std::vector<int8_t> q(w.size(), -128);
                       std::vector<float> scales(size_t(rows * cols / block), kUnwritten);
                       CALL_OP(backend, quantize_int8_weights, w.data(), rows, cols, block, q.data(), scales.data());
                       return Outputs{{"values", {q.begin(), q.end()}}, {"scales", values(scales)}};
                     }});
  }
  return cases;
}

std::vector<Case> cross_entropy_cases() {
  std::vector<Case> cases;
  uint32_t seed = 900;
  for (const auto& [rows, classes] : {std::pair<int64_t, int64_t>{9, 37}, std::pair<int64_t, int64_t>{64, 1001}})
    for (const bool weighted : {false, true}) {
      std::vector<float> logits = normal(rows * classes, ++seed, 2.0f);
      for (int64_t j = 0; j < classes; ++j) logits[size_t(2 * classes + j)] += 300.0f;  // exp overflows f32 unshifted
      std::vector<int32_t> targets;
      std::mt19937 rng(seed);
      for (int64_t r = 0; r < rows; ++r) targets.push_back(r % 4 == 0 ? -1 : int32_t(rng() % uint32_t(classes)));
      std::vector<float> weights = normal(rows, seed + 50);  // negative ones too, as policy gradients have
      weights[1] = 0.0f;
      const float logit_scale = weighted ? 1.0f / 0.7f : 1.0f;  // a policy's rows, sampled at temperature 0.7
      cases.push_back({fmt::format("rows={} classes={}{} logit_scale={} (rows 0, 4, ... without target)", rows,
                                   classes, weighted ? " weighted" : "", logit_scale),
                       "f32", kLoss, [=](Backend backend) {
                         const double loss = CALL_OP(backend, cross_entropy_loss, logits.data(), rows, classes,
                                                     targets.data(), weighted ? weights.data() : nullptr, logit_scale);
                         return Outputs{{"loss", {loss}}};
                       }});
    }
  return cases;
}

// ---- the KDA mixer ----

struct PrepareLayout {
  int64_t rows, heads, head_dim;
  int64_t HK() const { return heads * head_dim; }
  // The projection rows hold f, then two unrelated columns, then b, then three more.
  int64_t ld_proj() const { return HK() + heads + 5; }
  int64_t b_col() const { return HK() + 2; }
};

struct PrepareInputs {
  std::vector<float> conv, proj, a_log, dt_bias;
};

// Unit-normal logits, A_log ~ N(0.3, 0.5²) and dt_bias ~ N(−1, 0.5²) keep a·z within a few units:
// both gates run through their curved part.
PrepareInputs prepare_inputs(const PrepareLayout& s, uint32_t seed) {
  PrepareInputs in{normal(s.rows * 3 * s.HK(), seed), normal(s.rows * s.ld_proj(), seed + 1),
                   normal(s.heads, seed + 2, 0.5f), normal(s.HK(), seed + 3, 0.5f)};
  for (float& x : in.a_log) x += 0.3f;
  for (float& x : in.dt_bias) x -= 1.0f;
  return in;
}

// kda_prepare_forward's outputs.
struct Prepared {
  std::vector<float> q, k, v, inv_norm, g, beta;
};

Prepared prepare(Backend backend, const PrepareLayout& s, bool lower_bounded, const PrepareInputs& in) {
  const int64_t N = s.rows, H = s.heads, HK = s.HK();
  Prepared out{std::vector<float>(size_t(N * HK), kUnwritten), std::vector<float>(size_t(N * HK), kUnwritten),
               std::vector<float>(size_t(N * HK), kUnwritten), std::vector<float>(size_t(N * 2 * H), kUnwritten),
               std::vector<float>(size_t(N * HK), kUnwritten), std::vector<float>(size_t(N * H), kUnwritten)};
  const KdaDecayGate gate{lower_bounded, -5.0f, in.a_log.data(), in.dt_bias.data()};
  CALL_OP(backend, kda_prepare_forward, KdaPrepareShape{N, H, s.head_dim, s.ld_proj()}, gate,
          KdaPrepareInputs{in.conv.data(), in.proj.data(), in.proj.data() + s.b_col()},
          KdaPrepared{out.q.data(), out.k.data(), out.v.data(), out.inv_norm.data(), out.g.data(), out.beta.data()});
  return out;
}

std::vector<Case> kda_prepare_cases() {
  std::vector<Case> cases;
  uint32_t seed = 1000;
  // Head widths off the 16-lane vectors; 300 rows run in parallel.
  for (const PrepareLayout& s : {PrepareLayout{7, 3, 5}, PrepareLayout{5, 1, 21}, PrepareLayout{300, 2, 32}})
    for (const bool lower_bounded : {true, false}) {
      const PrepareInputs in = prepare_inputs(s, seed += 4);
      cases.push_back({fmt::format("rows={} heads={} head_dim={} {} gate", s.rows, s.heads, s.head_dim,
                                   lower_bounded ? "lower-bounded" : "softplus"),
                       "f32", kF32Elementwise, [=](Backend backend) {
                         const Prepared p = prepare(backend, s, lower_bounded, in);
                         return Outputs{{"q", values(p.q)},       {"k", values(p.k)}, {"v", values(p.v)},
                                        {"inv_norm", values(p.inv_norm)}, {"g", values(p.g)}, {"beta", values(p.beta)}};
                       }});
    }
  return cases;
}

std::vector<Case> kda_output_gate_cases() {
  std::vector<Case> cases;
  uint32_t seed = 1100;
  for (const auto& [rows, width] : kRowShapes) {
    const int64_t ld_logits = width + 5;
    const std::vector<float> normed = normal(rows * width, seed += 2),
                             logits = normal(rows * ld_logits, seed + 1, 2.0f);
    cases.push_back({fmt::format("rows={} width={} ld_logits={}", rows, width, ld_logits), "f32", kF32Elementwise,
                     [=](Backend backend) {
                       std::vector<float> gated(size_t(rows * width), kUnwritten);
                       CALL_OP(backend, kda_output_gate_forward, normed.data(), logits.data(), ld_logits, rows, width,
                               gated.data());
                       return Outputs{{"gated", values(gated)}};
                     }});
  }
  return cases;
}

std::vector<Case> kda_cases() {
  struct Shape {
    int64_t heads, key_dim, value_dim;
    std::vector<int64_t> lengths;
    bool initial_states, lower_bounded;
  };
  const Shape shapes[] = {
      {2, 16, 24, {37, 1, 70}, true, true},  // K ≠ V, a one-token sequence, continuing from states
      {1, 32, 32, {100}, false, true},       // not a multiple of the chunk, zero initial state
      {3, 16, 16, {20, 45}, true, false},    // the unbounded (softplus) gate
  };
  struct Variant {
    KdaPath path;
    bool bf16;
  };
  const Variant variants[] = {{KdaPath::Recurrent, false},      {KdaPath::ChunkedDense, false},
                              {KdaPath::ChunkedPairwise, false}, {KdaPath::ChunkedDense, true},
                              {KdaPath::ChunkedPairwise, true}};
  std::vector<Case> cases;
  uint32_t seed = 1200;
  for (const Shape& s : shapes) {
    // The delta rule's inputs as the mixer makes them: q, k, g and β from the prepare step (so q and
    // k are normalised and g is a real decay), v any values.
    const int64_t N = starts_of(s.lengths).back(), H = s.heads, K = s.key_dim, V = s.value_dim;
    const PrepareLayout layout{N, H, K};
    const Prepared p = prepare(Backend::Reference, layout, s.lower_bounded, prepare_inputs(layout, seed += 4));
    const std::vector<float> v = normal(N * H * V, seed + 1),
                             initial = normal(int64_t(s.lengths.size()) * H * K * V, seed + 2, 0.3f);
    for (const Variant& variant : variants) {
      if (variant.path == KdaPath::ChunkedDense && !s.lower_bounded) continue;  // needs the bounded gate
      const KdaOptions options{variant.path, 16, variant.bf16, -5.0f};
      cases.push_back(
          {fmt::format("H={} K={} V={} lengths={} {} path, chunk 16{}", H, K, V, list(s.lengths),
                       to_string(variant.path), s.initial_states ? ", initial states" : ""),
           variant.bf16 ? "bf16 products" : "f32", variant.bf16 ? kKdaBf16 : kF32Sums, [=](Backend backend) {
             const KdaShape shape{H, K, V};
             const std::vector<int64_t> starts = starts_of(s.lengths);
             const int64_t batch = int64_t(s.lengths.size());
             std::vector<float> states = initial, o(size_t(N * H * V), kUnwritten), finals(initial.size(), kUnwritten);
             const std::vector<float*> initial_rows = kda_state_pointers(states.data(), batch, shape),
                                       final_rows = kda_state_pointers(finals.data(), batch, shape);
             const KdaInputs in{batch,        starts.data(), p.q.data(), p.k.data(), v.data(), p.g.data(),
                                p.beta.data(), s.initial_states ? initial_rows.data() : nullptr};
             Workspace workspace;
             CALL_OP(backend, kda_forward, shape, in, options, o.data(), final_rows.data(), nullptr, workspace);
             return Outputs{{"o", values(o)}, {"final states", values(finals)}};
           }});
    }
  }
  return cases;
}

// ---- attention ----

std::vector<Case> attention_cases() {
  struct Shape {
    int64_t heads, qk_dim, v_dim, window;
    std::vector<int64_t> q_lens, kv_lens;
    const char* what;
  };
  const Shape shapes[] = {
      {3, 32, 32, 0, {65}, {65}, "training, one past the tile"},
      {2, 64, 64, 0, {1, 70, 5}, {1, 70, 5}, "a batch of lengths"},
      {2, 32, 32, 50, {37, 64}, {150, 101}, "sliding window, prefill on a cache"},
      {3, 24, 16, 0, {33, 1}, {40, 300}, "qk_dim ≠ v_dim, a decode step"},
      {2, 7, 5, 3, {10, 3}, {4, 0}, "odd widths, queries that see no key"},
  };
  std::vector<Case> cases;
  uint32_t seed = 1300;
  for (const Shape& s : shapes)
    for (const bool bf16_products : {false, true}) {
      const AttentionDims dims{s.heads, s.qk_dim, s.v_dim, s.window, float(1.0 / std::sqrt(double(s.qk_dim))),
                               bf16_products};
      const std::vector<int64_t> q_starts = starts_of(s.q_lens), k_starts = starts_of(s.kv_lens);
      const int64_t nq = q_starts.back(), nk = k_starts.back();
      const std::vector<float> q = normal(nq * s.heads * s.qk_dim, seed += 3),
                               k = normal(nk * s.heads * s.qk_dim, seed + 1),
                               v = normal(nk * s.heads * s.v_dim, seed + 2);
      cases.push_back({fmt::format("H={} Dqk={} Dv={} window={} q_lens={} kv_lens={}: {}", s.heads, s.qk_dim, s.v_dim,
                                   s.window, list(s.q_lens), list(s.kv_lens), s.what),
                       bf16_products ? "bf16 products" : "f32", bf16_products ? kBf16Products : kF32Sums,
                       [=](Backend backend) {
                         std::vector<float> o(size_t(nq * s.heads * s.v_dim), kUnwritten),
                             lse(size_t(nq * s.heads), kUnwritten);
                         Workspace workspace;
                         CALL_OP(backend, attention_forward, dims, int64_t(s.q_lens.size()), q_starts.data(),
                                 k_starts.data(), q.data(), k.data(), v.data(), o.data(), lse.data(), workspace);
                         return Outputs{{"o", values(o)}, {"lse", values(lse)}};
                       }});
    }
  return cases;
}

std::vector<Case> latent_attention_cases() {
  struct Shape {
    int64_t heads, latent, rope, window;
    std::vector<int64_t> lengths;
  };
  const Shape shapes[] = {
      {8, 128, 0, 0, {1, 5, 65, 300}},  // lengths around a tile
      {3, 40, 8, 0, {129, 2}},          // heads padded, rows not whole vectors
      {8, 64, 8, 5, {1, 4, 200}},       // sliding window
      {2, 32, 8, 0, {0, 17}},           // an empty cache
  };
  enum class Rows { F32, Bf16, Bf16Products };
  std::vector<Case> cases;
  uint32_t seed = 1400;
  for (const Shape& s : shapes) {
    const int64_t K = s.latent + s.rope, B = int64_t(s.lengths.size());
    std::vector<std::vector<float>> rows;
    // A row even for an empty cache: a cache names its rows whatever its length.
    for (int64_t L : s.lengths) rows.push_back(normal(std::max<int64_t>(L, 1) * K, ++seed));
    const std::vector<float> q = normal(B * s.heads * K, ++seed, 1.5f);  // a softmax far from uniform
    for (const Rows kind : {Rows::F32, Rows::Bf16, Rows::Bf16Products}) {
      if (kind == Rows::Bf16Products && s.latent % 32 != 0) continue;  // the bf16 kernel's requirement
      const LatentAttentionDims dims{s.heads, s.latent, s.rope, s.window, float(1.0 / std::sqrt(double(K))),
                                     kind == Rows::Bf16Products};
      // bf16 rows without bf16 products are widened exactly: f32 arithmetic on the same values.
      cases.push_back({fmt::format("H={} R={} Dr={} window={} lengths={}", s.heads, s.latent, s.rope, s.window,
                                   list(s.lengths)),
                       kind == Rows::F32 ? "f32 rows" : kind == Rows::Bf16 ? "bf16 rows" : "bf16 rows and products",
                       kind == Rows::Bf16Products ? kBf16Products : kF32Sums, [=](Backend backend) {
                         std::vector<std::vector<bf16>> rows16;
                         std::vector<LatentCacheRows> caches;
                         for (int64_t b = 0; b < B; ++b) {
                           LatentCacheRows cache;
                           if (kind == Rows::F32) {
                             cache.rows_f32 = rows[size_t(b)].data();
                           } else {
                             rows16.push_back(as<bf16>(rows[size_t(b)]));
                             cache.rows_bf16 = rows16.back().data();
                           }
                           cache.length = s.lengths[size_t(b)];
                           caches.push_back(cache);
                         }
                         std::vector<float> o(size_t(B * s.heads * s.latent), kUnwritten);
                         Workspace workspace;
                         CALL_OP(backend, latent_attention_decode, dims, B, caches.data(), q.data(), o.data(),
                                 workspace);
                         return Outputs{{"o", values(o)}};
                       }});
    }
  }
  return cases;
}

// ---- the table ----

const Op kOps[] = {
    {"gemm", single_gemm_cases},
    {"gemm_batched", batched_gemm_cases},
    {"small_gemm", small_gemm_cases},
    {"skinny_gemm", skinny_gemm_cases},
    {"rmsnorm_forward", rmsnorm_cases},
    {"layernorm_forward", layernorm_cases},
    {"gelu_forward", gelu_cases},
    {"gated_activation_forward", gated_activation_cases},
    {"sigmoid_rows", sigmoid_rows_cases},
    {"sigmoid_rows_backward", sigmoid_rows_backward_cases},
    {"sigmoid_gate", sigmoid_gate_cases},
    {"rope", rope_cases},
    {"rope_2d", rope_2d_cases},
    {"causal_conv1d_forward", causal_conv1d_cases},
    {"add_rows", add_rows_cases},
    {"copy_heads", copy_heads_cases},
    {"sum_heads", sum_heads_cases},
    {"gather_scatter_rows", gather_scatter_rows_cases},
    {"attn_res_forward", attn_res_forward_cases},
    {"attn_res_backward", attn_res_backward_cases},
    {"select_experts", select_experts_cases},
    {"routing_weights_backward", routing_weights_backward_cases},
    {"routed_output_backward", routed_output_backward_cases},
    {"combine_expert_rows", combine_expert_rows_cases},
    {"balancing", balancing_cases},
    {"quantize_int8_weights", quantize_int8_weights_cases},
    {"cross_entropy_loss", cross_entropy_cases},
    {"kda_prepare_forward", kda_prepare_cases},
    {"kda_output_gate_forward", kda_output_gate_cases},
    {"kda_forward", kda_cases},
    {"attention_forward", attention_cases},
    {"latent_attention_decode", latent_attention_cases},
};

void PrintTo(const Op& op, std::ostream* os) { *os << op.name; }

class BackendOps : public ::testing::TestWithParam<Op> {};

TEST_P(BackendOps, MatchTheReference) {
  const Op& op = GetParam();
  for (const Case& c : op.cases()) {
    const Outputs got = c.run(Backend::Linked), want = c.run(Backend::Reference);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const double error = relative_error(got[i].values, want[i].values);
      EXPECT_LE(error, c.tolerance) << op.name << " [" << c.shape << "] " << c.precision << ": " << got[i].name
                                    << " is off by " << error << " of its scale (tolerance " << c.tolerance << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOps, ::testing::ValuesIn(kOps),
                         [](const ::testing::TestParamInfo<Op>& info) { return std::string(info.param.name); });

// The model takes its attention paths from the backend: bf16 products never where the caller does
// not allow them or the op's contract excludes them (f32 rows, a latent width not a multiple of 32).
TEST(KernelBackend, Bf16ProductsOnlyWhereAllowed) {
  EXPECT_FALSE(attention_use_bf16_products(false));
  EXPECT_FALSE(latent_attention_use_bf16_products(64, /*bf16_rows=*/true, /*allowed=*/false));
  EXPECT_FALSE(latent_attention_use_bf16_products(64, /*bf16_rows=*/false, /*allowed=*/true));
  EXPECT_FALSE(latent_attention_use_bf16_products(48, /*bf16_rows=*/true, /*allowed=*/true));
}

// The name states the instruction set the kernels were built for: portable exactly when vec.h's
// Vec is its plain-loop struct (aligned as a float, where the AVX-512 register aligns to 64), and
// an AVX instruction set exactly when the int8 products run native kernels (VNNI or AVX2).
TEST(KernelBackend, NameStatesTheInstructionSet) {
  const std::string name = kernel_backend_name();
  EXPECT_EQ(name.rfind("cpu (", 0), 0u) << name;
  EXPECT_EQ(name == "cpu (portable)", alignof(vec::Vec) == alignof(float)) << name;
  EXPECT_EQ(name.find("AVX") != std::string::npos, int8_native_kernels()) << name;
}

}  // namespace
}  // namespace hyla
