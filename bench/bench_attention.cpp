// Blocked causal attention (kernels/attention.h): forward, backward and forward+backward time and
// GFLOP/s for the MLA shapes, each as a fraction of a 2048³ f32 gemm (hyla::gemm) measured first
// in the same run. FLOPs count the causal work only: forward 2·(Dqk + Dv)·H per visible
// (query, key) pair (S = QKᵀ and PV), backward 2·(3·Dqk + 2·Dv)·H per pair (S, dP = dO Vᵀ, dV, dK,
// dQ: 2.5× the forward when Dqk = Dv). Softmax and exp work is not counted. `fwd_bf16` is the
// forward with bf16 block products (AttentionDims::bf16_products), still against the f32 gemm.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "markdown_reporter.h"
#include "random_inputs.h"
#include "hyla/kernels/attention.h"
#include "hyla/kernels/matmul.h"

namespace {

using hyla::bench::random_vector;

double gemm_gflops = 0;

void BM_gemm_square(benchmark::State& state) {
  constexpr int64_t n = 2048;
  const auto A = random_vector(n * n, 1), B = random_vector(n * n, 2);
  std::vector<float> C(size_t(n * n));
  hyla::gemm(hyla::Trans::N, hyla::Trans::N, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, C.data(), n);
  for (auto _ : state) {
    hyla::gemm(hyla::Trans::N, hyla::Trans::N, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, C.data(), n);
    benchmark::DoNotOptimize(C.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["is_gemm"] = 1;
}

// What one attention tile product would cost through oneDNN: a single 64×64×64 call (the kernel
// would make three to five of these per tile), called from one thread as the kernel's threads would.
void BM_gemm_tile(benchmark::State& state) {
  constexpr int64_t n = 64;
  const auto A = random_vector(n * n, 1), B = random_vector(n * n, 2);
  std::vector<float> C(size_t(n * n));
  for (auto _ : state) {
    hyla::gemm(hyla::Trans::N, hyla::Trans::T, n, n, n, 1.0f, A.data(), n, B.data(), n, 0.0f, C.data(), n);
    benchmark::DoNotOptimize(C.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["is_gemm"] = 0;
}

struct Shape {
  const char* name;
  int64_t batch, T, heads, dqk, dv, window;
};

enum class Pass { Forward, ForwardBf16, Backward, Both };

void BM_attention(benchmark::State& state, Shape sh, Pass pass) {
  const hyla::AttentionDims dims{sh.heads, sh.dqk, sh.dv, sh.window, float(1.0 / std::sqrt(double(sh.dqk)))};
  hyla::AttentionDims dims_bf16 = dims;
  dims_bf16.bf16_products = true;
  std::vector<int64_t> starts;
  for (int64_t b = 0; b <= sh.batch; ++b) starts.push_back(b * sh.T);
  const int64_t N = sh.batch * sh.T, H = sh.heads;
  const auto q = random_vector(N * H * sh.dqk, 1), k = random_vector(N * H * sh.dqk, 2);
  const auto v = random_vector(N * H * sh.dv, 3), d_o = random_vector(N * H * sh.dv, 4);
  std::vector<float> o(size_t(N * H * sh.dv)), lse(size_t(N * H)), dq(q.size()), dk(k.size()), dv(v.size());
  hyla::Workspace ws;
  auto forward = [&] {
    hyla::attention_forward(dims, sh.batch, starts.data(), starts.data(), q.data(), k.data(), v.data(), o.data(),
                            lse.data(), ws);
  };
  auto backward = [&] {
    hyla::attention_backward(dims, sh.batch, starts.data(), starts.data(), q.data(), k.data(), v.data(), o.data(),
                             lse.data(), d_o.data(), dq.data(), dk.data(), dv.data(), ws);
  };
  auto forward_bf16 = [&] {
    hyla::attention_forward(dims_bf16, sh.batch, starts.data(), starts.data(), q.data(), k.data(), v.data(),
                            o.data(), lse.data(), ws);
  };
  forward_bf16();  // warm-up: grows the workspace and touches every buffer once
  forward();
  backward();
  for (auto _ : state) {
    if (pass == Pass::ForwardBf16) forward_bf16();
    if (pass == Pass::Forward || pass == Pass::Both) forward();
    if (pass == Pass::Backward || pass == Pass::Both) backward();
    benchmark::DoNotOptimize(dq.data());
  }
  double pairs = 0;  // visible (query, key) pairs
  for (int64_t t = 0; t < sh.T; ++t) pairs += double(sh.window ? std::min(t + 1, sh.window) : t + 1);
  pairs *= double(sh.batch * H);
  const double fwd = 2.0 * double(sh.dqk + sh.dv) * pairs, bwd = 2.0 * double(3 * sh.dqk + 2 * sh.dv) * pairs;
  const double flops = pass == Pass::Backward ? bwd : pass == Pass::Both ? fwd + bwd : fwd;
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["is_gemm"] = 0;
}

const Shape kShapes[] = {
    {"B1_T512_H8_D64", 1, 512, 8, 64, 64, 0},         {"B1_T2048_H8_D64", 1, 2048, 8, 64, 64, 0},
    {"B1_T8192_H8_D64", 1, 8192, 8, 64, 64, 0},       {"B8_T512_H8_D64", 8, 512, 8, 64, 64, 0},
    {"B1_T2048_H8_Dqk192_Dv128", 1, 2048, 8, 192, 128, 0}, {"B1_T8192_H8_D64_W512", 1, 8192, 8, 64, 64, 512},
};

void register_all() {
  benchmark::RegisterBenchmark("gemm_f32_2048", BM_gemm_square)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
  benchmark::RegisterBenchmark("onednn_gemm_64x64x64_one_thread", [](benchmark::State& st) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    BM_gemm_tile(st);
    omp_set_num_threads(saved);
  })->Unit(benchmark::kMicrosecond)->MinTime(0.2)->UseRealTime();
  for (const Shape& s : kShapes)
    for (Pass p : {Pass::Forward, Pass::ForwardBf16, Pass::Backward, Pass::Both}) {
      const char* pass = p == Pass::Forward ? "/fwd" : p == Pass::ForwardBf16 ? "/fwd_bf16" : p == Pass::Backward ? "/bwd" : "/fwd+bwd";
      const std::string name = std::string(s.name) + pass;
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { BM_attention(st, s, p); })
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5)
          ->UseRealTime();
    }
}

// Adds each row's rate as a fraction of the gemm's (`vs_gemm`) and prints a markdown table at the end.
// Run with --benchmark_repetitions=3 --benchmark_report_aggregates_only=true on a shared machine.
class RatioReporter : public hyla::bench::MarkdownReporter {
 public:
  RatioReporter() : MarkdownReporter("| shape/pass | time | GFLOP/s | vs f32 gemm |\n|---|---|---|---|\n") {}

 protected:
  std::string row(Run& r) override {
    // With --benchmark_repetitions the table takes each benchmark's median.
    if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") return "";
    const double rate = r.counters["GFLOPs"].value;
    if (r.counters["is_gemm"].value > 0) gemm_gflops = rate;
    if (gemm_gflops > 0) r.counters["vs_gemm"] = rate / gemm_gflops;
    r.counters.erase("is_gemm");
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %.2f %s | %.0f | %.2f |\n", short_name(r).c_str(), r.GetAdjustedRealTime(),
                  benchmark::GetTimeUnitString(r.time_unit), rate, r.counters["vs_gemm"].value);
    return line;
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all();
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
