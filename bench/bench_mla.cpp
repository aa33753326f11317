// The MLA layer of configs/small.json (d 512, 8 heads, kv_lora 128, nope 64, v 64, output gate,
// NoPE): training forward and forward+backward, f32 and bf16, at 8×512 and 2×2048 tokens; the
// decode step (MlaMixer::forward_cached under Precision::BF16, one token per sequence, bf16 latent
// cache) for 1, 4 and 16 sequences at cache depths 512, 8192 and 65536, with the latent attention
// kernel alone (bf16 products, and f32 arithmetic); and the absorbed decode against the
// up-projected one at depth 8192.
//
// Every rate is set against a reference measured in the same process first: the 2048³ oneDNN GEMM
// of the same dtype for training (FLOPs: the layer's matrix products, causal attention pairs
// only), and a vectorised streaming read for decode (bytes: the latent cache rows the step reads,
// plus the layer's weights for the whole step). Decode steps rotate over enough copies of the
// caches to fill 256 MB, so every step reads its cache (and the weights) from memory, as a step
// of a many-layer model would, not from the 32 MB L3.
//
// Run: flock -x /tmp/hyla-cpu.lock ./build/bench_mla (prints a markdown table at the end).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "markdown_reporter.h"
#include "random_inputs.h"
#include "hyla/core/memory.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/latent_attention.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/model_files.h"
#include "hyla/model/mla_mixer.h"

namespace {

using hyla::bench::random_vector;
using namespace hyla;

// References, measured before the benchmarks.
double gemm_f32_gflops = 0, gemm_bf16_gflops = 0, read_gbs = 0;

double best_seconds(const std::function<void()>& run, int reps) {
  run();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void measure_references() {
  const int64_t n = 2048;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  std::vector<bf16> a16(a.size(), to_bf16(0.5f)), b16(b.size(), to_bf16(0.25f));
  const double flops = 2.0 * double(n) * n * n;
  gemm_f32_gflops = flops / best_seconds([&] {
    gemm(Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }, 5) * 1e-9;
  gemm_bf16_gflops = flops / best_seconds([&] {
    gemm(Trans::N, Trans::N, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
  }, 5) * 1e-9;
  read_gbs = measure_read_bandwidth_gbs();
  std::printf("references (this run, %d threads): gemm 2048^3 f32 %.0f GFLOP/s, bf16 %.0f GFLOP/s; streaming read %.1f GB/s\n",
              omp_get_max_threads(), gemm_f32_gflops, gemm_bf16_gflops, read_gbs);
}

struct Layer {
  ModelConfig config = model_config_of(HYLA_SOURCE_DIR "/configs/small.json");
  ParamStore store;
  std::unique_ptr<MlaMixer> mixer;
  Layer() {
    mixer = std::make_unique<MlaMixer>(store, "model.layers.3.self_attn.", config, LayerType::Mla);
    store.allocate();
    store.initialize(config, 1);
    store.refresh_bf16();
  }
  int64_t d() const { return config.hidden_size; }
  // Matrix-product FLOPs of the projections per token, forward.
  double projection_flops() const {
    const MlaConfig& m = config.mla;
    const int64_t H = m.num_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim, Dv = m.v_head_dim;
    const int64_t input = (m.q_lora_rank ? m.q_lora_rank : H * qk) + m.kv_lora_rank + m.qk_rope_head_dim +
                          (m.output_gate ? H * Dv : 0);
    double f = 2.0 * d() * input + 2.0 * m.kv_lora_rank * H * (m.qk_nope_head_dim + Dv) + 2.0 * H * Dv * d();
    if (m.q_lora_rank) f += 2.0 * m.q_lora_rank * H * qk;
    return f;
  }
  // Parameters of the layer (every one is read once per decode step).
  int64_t parameters() const { return store.numel(); }
};

Layer& layer() {
  static Layer l;
  return l;
}

enum Kind { kTraining = 0, kDecode = 1 };

void BM_training(benchmark::State& state, int64_t B, int64_t T, Precision p, bool backward) {
  Layer& L = layer();
  const TokenBatch tokens = TokenBatch::uniform(B, T);
  const int64_t N = B * T;
  const auto u = random_vector(N * L.d(), 1), dy = random_vector(N * L.d(), 2);
  std::vector<float> y(u.size()), du(u.size());
  Workspace workspace;
  const ForwardContext ctx{tokens, workspace, p, backward};
  auto step = [&] {
    L.mixer->forward(u.data(), y.data(), ctx);
    if (backward) L.mixer->backward(dy.data(), du.data());
  };
  step();  // grows the buffers, creates the GEMM primitives
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(du.data());
  }
  const MlaConfig& m = L.config.mla;
  const double pairs = double(B) * double(T) * double(T + 1) / 2;
  const int64_t H = m.num_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim, Dv = m.v_head_dim;
  double flops = double(N) * L.projection_flops() + 2.0 * double(qk + Dv) * H * pairs;
  if (backward) flops += 2.0 * double(N) * L.projection_flops() + 2.0 * double(3 * qk + 2 * Dv) * H * pairs;
  state.counters["rate"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["reference"] = p == Precision::BF16 ? gemm_bf16_gflops : gemm_f32_gflops;
  state.counters["kind"] = double(kTraining);
}

// Latent caches of `depth` tokens for B sequences, in as many copies as fill 256 MB (at least
// one), with values that look like a normalised latent.
struct CachePool {
  std::shared_ptr<void> memory;
  int64_t values = 0;
  bf16* data() { return static_cast<bf16*>(memory.get()); }
  static CachePool& get(int64_t values_needed) {
    static CachePool pool;
    const int64_t target = std::max<int64_t>(values_needed, int64_t(128) << 20);  // 256 MB of bf16
    if (pool.values < target) {
      pool.memory = allocate_aligned(size_t(target) * sizeof(bf16));
      bf16* x = pool.data();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < target; ++i) x[i] = to_bf16(float(int64_t((uint64_t(i) * 2654435761u) >> 7 & 0xfff)) / 1024.0f - 2.0f);
      pool.values = target;
    }
    return pool;
  }
};

enum class DecodeRun { Layer, LayerUpProjected, KernelF32, KernelBf16 };

void BM_decode(benchmark::State& state, int64_t B, int64_t depth, DecodeRun run) {
  Layer& L = layer();
  const int64_t width = L.mixer->cache_width(), set = B * depth * width;
  CachePool& pool = CachePool::get(set);
  const int64_t copies = pool.values / set;
  const auto u = random_vector(B * L.d(), 3);
  std::vector<float> y(u.size());
  const TokenBatch tokens = TokenBatch::packed(std::vector<int64_t>(size_t(B), 1), std::vector<int64_t>(size_t(B), depth - 1));
  std::vector<LayerCache> views(static_cast<size_t>(B));
  std::vector<LayerCache*> slots;
  for (LayerCache& v : views) slots.push_back(&v);
  const MlaConfig& m = L.config.mla;
  const int64_t H = m.num_heads, R = m.kv_lora_rank;
  const auto q = random_vector(B * H * width, 4);
  std::vector<float> o(static_cast<size_t>(B * H * R));
  std::vector<LatentCacheRows> rows(static_cast<size_t>(B));
  Workspace ws;
  const LatentAttentionDims dims{H, R, m.qk_rope_head_dim, 0,
                                 float(1.0 / std::sqrt(double(m.qk_nope_head_dim + m.qk_rope_head_dim))),
                                 run == DecodeRun::KernelBf16};
  int64_t copy = 0;
  auto step = [&] {
    bf16* base = pool.data() + copy * set;
    copy = (copy + 1) % copies;
    if (run == DecodeRun::KernelF32 || run == DecodeRun::KernelBf16) {
      for (int64_t b = 0; b < B; ++b) rows[size_t(b)] = {base + b * depth * width, nullptr, depth};
      latent_attention_decode(dims, B, rows.data(), q.data(), o.data(), ws);
      return;
    }
    for (int64_t b = 0; b < B; ++b) views[size_t(b)] = LatentCache{base + b * depth * width, nullptr, depth - 1, depth};
    L.mixer->forward(u.data(), y.data(), {tokens, ws, Precision::BF16}, slots,
                            run == DecodeRun::Layer ? MlaMixer::DecodePath::Absorbed : MlaMixer::DecodePath::UpProjected);
  };
  step();
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(y.data());
    benchmark::DoNotOptimize(o.data());
  }
  // Bytes the step must read: the cache rows, and (whole layer) the weights: bf16 copies for the
  // projections, f32 kv_b for the absorption.
  double bytes = double(set) * sizeof(bf16);
  const double kv_b = double(R * H * (m.qk_nope_head_dim + m.v_head_dim));
  if (run == DecodeRun::Layer || run == DecodeRun::LayerUpProjected) bytes += (double(L.parameters()) - kv_b) * 2 + kv_b * 4;
  state.counters["rate"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["reference"] = read_gbs;
  state.counters["kind"] = double(kDecode);
}

void register_all() {
  for (auto [B, T] : {std::pair<int64_t, int64_t>{8, 512}, {2, 2048}})
    for (Precision p : {Precision::F32, Precision::BF16})
      for (bool backward : {false, true}) {
        const std::string name = "train_" + std::to_string(B) + "x" + std::to_string(T) +
                                 (p == Precision::BF16 ? "_bf16" : "_f32") + (backward ? "/fwd+bwd" : "/fwd");
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { BM_training(s, B, T, p, backward); })
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.5)
            ->UseRealTime();
      }
  for (DecodeRun run : {DecodeRun::Layer, DecodeRun::KernelBf16, DecodeRun::KernelF32})
    for (int64_t depth : {512, 8192, 65536})
      for (int64_t B : {1, 4, 16}) {
        const char* what = run == DecodeRun::Layer ? "decode_layer" : run == DecodeRun::KernelBf16 ? "kernel_bf16" : "kernel_f32";
        const std::string name = std::string(what) + "/seqs" + std::to_string(B) + "/depth" + std::to_string(depth);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { BM_decode(s, B, depth, run); })
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.3)
            ->UseRealTime();
      }
  for (int64_t B : {1, 4})
    for (DecodeRun run : {DecodeRun::Layer, DecodeRun::LayerUpProjected}) {
      const std::string name = std::string(run == DecodeRun::Layer ? "absorbed" : "up_projected") + "/seqs" +
                               std::to_string(B) + "/depth8192";
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { BM_decode(s, B, 8192, run); })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3)
          ->UseRealTime();
    }
}

// Prints a markdown table at the end: time, rate (GFLOP/s for training, GB/s read for decode) and
// the rate over its reference; and the up-projected / absorbed time ratios.
class TableReporter : public hyla::bench::MarkdownReporter {
 public:
  TableReporter() : MarkdownReporter("| benchmark | time | rate | vs reference |\n|---|---|---|---|\n") {}
  void Finalize() override {
    MarkdownReporter::Finalize();
    for (const char* seqs : {"seqs1", "seqs4"}) {
      const std::string a = std::string("absorbed/") + seqs + "/depth8192", u = std::string("up_projected/") + seqs + "/depth8192";
      if (times_us_.count(a) && times_us_.count(u))
        std::printf("up-projected / absorbed decode, %s, depth 8192: %.1fx\n", seqs, times_us_[u] / times_us_[a]);
    }
  }

 protected:
  std::string row(Run& r) override {
    if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") return "";
    const std::string name = short_name(r);
    const double rate = r.counters.at("rate").value, reference = r.counters.at("reference").value;
    const bool training = r.counters.at("kind").value == double(kTraining);
    times_us_[name] = r.GetAdjustedRealTime() * (r.time_unit == benchmark::kMillisecond ? 1e3 : 1.0);
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %.3g %s | %.1f %s | %.2f |\n", name.c_str(), r.GetAdjustedRealTime(),
                  benchmark::GetTimeUnitString(r.time_unit), rate, training ? "GFLOP/s" : "GB/s", rate / reference);
    return line;
  }

 private:
  std::map<std::string, double> times_us_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  measure_references();
  register_all();
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
