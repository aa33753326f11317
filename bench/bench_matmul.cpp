// GFLOP/s of the oneDNN matmul wrapper for the projection shapes of configs/small.json at 4096
// tokens (forward x.W^T, backward-data dy.W, backward-weight dy^T.x), for batches of 64x64x64
// products, and for a large square product measured first in the same run; each shape reports
// `vs_square`, its rate as a fraction of the square's.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "markdown_reporter.h"
#include "hyla/core/half.h"
#include "hyla/kernels/matmul.h"

namespace {

using hyla::Trans;

template <typename T>
std::vector<T> random_matrix(int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, float>) x = dist(rng);
    else x = hyla::to_bf16(dist(rng));
  }
  return v;
}

template <typename T>
void BM_gemm(benchmark::State& state, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, int64_t batch,
             bool is_square) {
  const auto A = random_matrix<T>(batch * M * K), B = random_matrix<T>(batch * K * N);
  std::vector<float> C(size_t(batch * M * N));
  const int64_t lda = ta == Trans::N ? K : M, ldb = tb == Trans::N ? N : K;
  auto call = [&] {
    if (batch == 1)
      hyla::gemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N);
    else
      hyla::gemm_batched(batch, ta, tb, M, N, K, 1.0f, A.data(), lda, M * K, B.data(), ldb, K * N, 0.0f,
                         C.data(), N, M * N);
  };
  call();
  for (auto _ : state) {
    call();
    benchmark::DoNotOptimize(C.data());
  }
  const double flops = 2.0 * double(batch) * double(M) * double(N) * double(K);
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const int kind = std::is_same_v<T, float> ? 0 : 1;
  // Google Benchmark only knows the rate after the run; the ratio is computed in the reporter.
  state.counters["is_square"] = is_square;
  state.counters["kind"] = kind;
}

struct Shape {
  const char* name;
  int64_t out, in;
};

// configs/small.json: d = 512, KDA/MLA widths 512, kv_lora 128, kv_b 1024, dense FFN 1408,
// shared expert 128, router 128 experts, vocab 8192; the five KDA input projections fused (2560).
const Shape kShapes[] = {
    {"kda_qkvfg_fused", 2560, 512}, {"attn_out_proj", 512, 512}, {"mla_kv_a", 128, 512},
    {"mla_kv_b", 1024, 128},        {"dense_gate_up", 2816, 512}, {"dense_down", 512, 1408},
    {"shared_expert_up", 256, 512}, {"shared_expert_down", 512, 128}, {"router", 128, 512},
    {"lm_head", 8192, 512},
};

void register_all() {
  constexpr int64_t kTokens = 4096, kSquare = 2048;
  for (int kind = 0; kind < 2; ++kind) {
    const std::string dt = kind ? "bf16" : "f32";
    auto reg = [&](const std::string& name, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, int64_t batch,
                   bool square) {
      benchmark::RegisterBenchmark((dt + "/" + name).c_str(), [=](benchmark::State& s) {
        if (kind) BM_gemm<hyla::bf16>(s, ta, tb, M, N, K, batch, square);
        else BM_gemm<float>(s, ta, tb, M, N, K, batch, square);
      })->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();
    };
    reg("square_2048", Trans::N, Trans::N, kSquare, kSquare, kSquare, 1, true);
    for (const Shape& s : kShapes) {
      reg(std::string(s.name) + "/fwd", Trans::N, Trans::T, kTokens, s.out, s.in, 1, false);
      reg(std::string(s.name) + "/bwd_data", Trans::N, Trans::N, kTokens, s.in, s.out, 1, false);
      reg(std::string(s.name) + "/bwd_weight", Trans::T, Trans::N, s.out, s.in, kTokens, 1, false);
    }
    reg("batch256_64x64x64", Trans::N, Trans::N, 64, 64, 64, 256, false);
    reg("batch256_64x64x64_bt", Trans::N, Trans::T, 64, 64, 64, 256, false);
  }
}

// Adds each row's GFLOP/s as a fraction of the square product of the same dtype, and prints a
// markdown table of all rows at the end (for BENCHMARKS.md).
class RatioReporter : public hyla::bench::SquareRatioReporter {
 public:
  RatioReporter() : SquareRatioReporter("| shape | ms | GFLOP/s | vs square |\n|---|---|---|---|\n") {}

 protected:
  std::string row(Run& r) override {
    const double rate = add_vs_square(r);
    return "| " + short_name(r) + " | " + std::to_string(r.GetAdjustedRealTime()).substr(0, 6) + " | " +
           std::to_string(int(rate + 0.5)) + " | " + std::to_string(r.counters["vs_square"].value).substr(0, 4) + " |\n";
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
