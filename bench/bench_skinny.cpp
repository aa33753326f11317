// Decode-shaped products y = x · Wᵀ (1 to 4 rows of x) with the weights cold in memory, as in
// decoding where every weight is read once per token: skinny_gemm against oneDNN's matmul on the
// same operands. Each benchmark rotates through copies of W totalling 256 MB so that no call
// finds W in cache, and reports the weight bytes read per second (GB/s) next to the streaming
// read bandwidth measured at the start of the run (`read_GBps`). W lies in huge pages, as the
// model's weights do (allocate_aligned): in 4 KB pages every few rows cost a TLB miss.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "hyla/core/half.h"
#include "hyla/core/memory.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/matmul.h"
#include "hyla/kernels/skinny_gemm.h"

namespace {

using hyla::bf16;

double read_bandwidth = 0;

template <typename T>
void BM_decode_product(benchmark::State& state, bool skinny) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const int64_t copies = std::max<int64_t>(2, (int64_t(256) << 20) / (N * K * int64_t(sizeof(T))));
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  const auto memory = hyla::allocate_aligned(size_t(copies * N * K) * sizeof(T));
  T* W = static_cast<T*>(memory.get());
  std::vector<T> x(size_t(M * K));
  const auto value = [](float f) {
    if constexpr (std::is_same_v<T, float>) return f;
    else return hyla::to_bf16(f);
  };
  for (int64_t i = 0; i < copies * N * K; ++i) W[i] = value(dist(rng));
  for (auto& v : x) v = value(dist(rng));
  std::vector<float> y(size_t(M * N));
  int64_t c = 0;
  for (auto _ : state) {
    const T* w = W + (c++ % copies) * N * K;
    if (skinny) hyla::skinny_gemm(M, N, K, 1.0f, x.data(), K, w, K, 0.0f, y.data(), N);
    else hyla::gemm_batched(1, hyla::Trans::N, hyla::Trans::T, M, N, K, 1.0f, x.data(), K, 0, w, K, 0, 0.0f, y.data(), N, 0);
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = double(N * K) * sizeof(T);
  state.counters["GBps"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (read_bandwidth == 0) read_bandwidth = hyla::measure_read_bandwidth_gbs();
  state.counters["read_GBps"] = read_bandwidth;
}

// Decode shapes of configs/small.json (hidden 512): lm_head, the dense FFN, attention and
// KDA projections, a shared expert.
void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t M : {1, 4})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{8192, 512}, {2816, 512}, {512, 1408}, {1536, 512}, {512, 512}, {256, 512}})
      b->Args({M, N, K});
}

void BM_skinny_bf16(benchmark::State& s) { BM_decode_product<bf16>(s, true); }
void BM_onednn_bf16(benchmark::State& s) { BM_decode_product<bf16>(s, false); }
void BM_skinny_f32(benchmark::State& s) { BM_decode_product<float>(s, true); }
void BM_onednn_f32(benchmark::State& s) { BM_decode_product<float>(s, false); }
BENCHMARK(BM_skinny_bf16)->Apply(shapes);
BENCHMARK(BM_onednn_bf16)->Apply(shapes);
BENCHMARK(BM_skinny_f32)->Apply(shapes);
BENCHMARK(BM_onednn_f32)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
