// The MoE layer of configs/small.json (d 512, 128 experts of width 128, top-4, one shared expert)
// at 4096 and 1024 tokens: forward (no saving, as in inference) and forward+backward (training)
// in f32 and bf16. GFLOP/s count the expert products only, 2·3·d·w per routed slot plus the
// shared expert's per token (backward twice the forward), over the whole layer's time (router,
// dispatch, activations and combine included), as a fraction of a 2048³ gemm of the same dtype
// measured first in the same run. The routing is balanced as in training: a few quantile
// balancing steps on other batches run before the timing (the load column is the timed batch's).
//
// `experts/...` rows time the alternatives for the forward expert products alone (gate+up and
// down, 128 tokens for every expert, inputs already gathered): one oneDNN call per expert, one
// batched oneDNN call over all experts, and the layer's kernel (per-thread small_gemm blocks).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "markdown_reporter.h"
#include "random_inputs.h"
#include "hyla/core/half.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/model_files.h"
#include "hyla/model/ffn.h"

namespace {

using hyla::bench::random_vector;
using hyla::Precision;

struct SmallMoe {
  hyla::ModelConfig config = hyla::model_config_of(std::string(HYLA_SOURCE_DIR) + "/configs/small.json");
  hyla::ParamStore store;
  std::unique_ptr<hyla::MoeFfn> ffn;
  SmallMoe() {
    ffn = std::make_unique<hyla::MoeFfn>(store, "model.layers.1.mlp.", config);
    store.allocate();
    store.initialize(config, 1);
    store.refresh_bf16();
  }
  int64_t d() const { return config.hidden_size; }
  // Forward FLOPs of the expert products for n tokens.
  double forward_flops(int64_t n) const {
    const hyla::MoeConfig& m = config.moe;
    return 2.0 * 3.0 * double(d()) * double(m.moe_intermediate_size) * double(n) *
           double(m.num_experts_per_tok + m.num_shared_experts);
  }
};

SmallMoe& small_moe() {
  static SmallMoe layer;
  return layer;
}

// The routed experts of the same layer alone, in a store of their own.
struct SmallExperts {
  hyla::ModelConfig config = small_moe().config;
  hyla::ParamStore store;
  hyla::RoutedExperts experts;
  SmallExperts() {
    experts = hyla::RoutedExperts(store, "mlp.", config, config.hidden_size);
    store.allocate();
    store.initialize(config, 2);
    store.refresh_bf16();
  }
};

SmallExperts& small_experts() {
  static SmallExperts experts;
  return experts;
}

void BM_square(benchmark::State& state, int kind) {
  constexpr int64_t n = 2048;
  const auto a = random_vector(n * n, 1), b = random_vector(n * n, 2);
  std::vector<float> c(size_t(n * n));
  std::vector<hyla::bf16> a16(a.size()), b16(b.size());
  hyla::convert(a.data(), a16.data(), a.size());
  hyla::convert(b.data(), b16.data(), b.size());
  auto call = [&] {
    if (kind) hyla::gemm(hyla::Trans::N, hyla::Trans::N, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    else hyla::gemm(hyla::Trans::N, hyla::Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  call();
  for (auto _ : state) {
    call();
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["is_square"] = 1;
  state.counters["kind"] = kind;
}

void BM_layer(benchmark::State& state, int64_t n, Precision precision, bool backward) {
  SmallMoe& layer = small_moe();
  const int64_t d = layer.d();
  const auto u = random_vector(n * d, 3), dy = random_vector(n * d, 4);
  std::vector<float> y(size_t(n * d)), du(size_t(n * d));
  const hyla::TokenBatch tokens = hyla::TokenBatch::uniform(1, n);
  hyla::Workspace workspace;
  const hyla::ForwardContext train{tokens, workspace, precision, true, 1.0f}, infer{tokens, workspace, precision, false, 1.0f};
  for (int step = 0; step < 4; ++step) {  // balance the routing on other batches, as after some training
    const auto batch = random_vector(n * d, 10 + step);
    layer.ffn->forward(batch.data(), y.data(), train);
    layer.ffn->backward(dy.data(), du.data());
    hyla::MoeFfn* moe = layer.ffn.get();
    hyla::update_balancing(std::span(&moe, 1), hyla::single_process());
  }
  layer.ffn->forward(u.data(), y.data(), infer);
  const float max_over_mean = layer.ffn->load_stats().max_over_mean;
  for (auto _ : state) {
    if (backward) {
      layer.ffn->forward(u.data(), y.data(), train);
      layer.ffn->backward(dy.data(), du.data());
    } else {
      layer.ffn->forward(u.data(), y.data(), infer);
    }
    benchmark::DoNotOptimize(du.data());
  }
  const double flops = layer.forward_flops(n) * (backward ? 3.0 : 1.0);
  state.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["max_over_mean"] = max_over_mean;
  state.counters["is_square"] = 0;
  state.counters["kind"] = precision == Precision::BF16;
}

// The forward expert products alone, 128 experts × 128 tokens (d 512, w 128), three ways.
enum class ExpertPath { OnednnPerExpert, OnednnBatched, SmallGemmBlocks };

void BM_experts(benchmark::State& state, ExpertPath path, Precision precision) {
  SmallExperts& layer = small_experts();
  const hyla::MoeConfig& m = layer.config.moe;
  const int64_t E = m.num_experts, k = m.num_experts_per_tok, w = m.moe_intermediate_size, d = layer.config.hidden_size;
  const int64_t tokens = E * 128 / k, slots = tokens * k;
  // Token t takes experts 4t .. 4t+3 (mod E): 128 slots for every expert.
  std::vector<int32_t> expert_ids(static_cast<size_t>(slots));
  std::vector<float> routing_weights(static_cast<size_t>(slots), 1.0f);
  for (int64_t i = 0; i < slots; ++i) expert_ids[size_t(i)] = int32_t(i % E);
  hyla::Routing routing{tokens, E, k, nullptr, expert_ids.data(), routing_weights.data()};
  hyla::ExpertDispatch dispatch;
  dispatch.build(routing);
  const auto x = random_vector(tokens * d, 5);
  const auto gathered = random_vector(slots * d, 6);  // the slots' rows, expert by expert
  std::vector<hyla::bf16> gathered16(gathered.size());
  hyla::convert(gathered.data(), gathered16.data(), gathered.size());
  std::vector<float> gu(size_t(slots * 2 * w)), out(size_t(slots * d));
  std::vector<hyla::bf16> h16(size_t(slots * w));
  const auto h = random_vector(slots * w, 7);
  hyla::convert(h.data(), h16.data(), h.size());
  // Expert e's [gate; up] is [2w, d] at e·3dw from the first expert's, its down [d, w] after it.
  const hyla::Param& first = layer.store.get("mlp.experts.0.gate_proj.weight");
  const float* w32 = first.value.data<float>();
  const hyla::bf16* w16 = first.v16();
  const int64_t stride = 3 * d * w, per = slots / E;
  hyla::Workspace workspace;
  auto run = [&] {
    const bool bf16 = precision == Precision::BF16;
    switch (path) {
      case ExpertPath::OnednnPerExpert:
        for (int64_t e = 0; e < E; ++e) {
          float* g = gu.data() + e * per * 2 * w;
          if (bf16) {
            hyla::gemm(hyla::Trans::N, hyla::Trans::T, per, 2 * w, d, 1.0f, gathered16.data() + e * per * d, d,
                       w16 + e * stride, d, 0.0f, g, 2 * w);
            hyla::gemm(hyla::Trans::N, hyla::Trans::T, per, d, w, 1.0f, h16.data() + e * per * w, w,
                       w16 + e * stride + 2 * d * w, w, 0.0f, out.data() + e * per * d, d);
          } else {
            hyla::gemm(hyla::Trans::N, hyla::Trans::T, per, 2 * w, d, 1.0f, gathered.data() + e * per * d, d,
                       w32 + e * stride, d, 0.0f, g, 2 * w);
            hyla::gemm(hyla::Trans::N, hyla::Trans::T, per, d, w, 1.0f, g, 2 * w, w32 + e * stride + 2 * d * w, w,
                       0.0f, out.data() + e * per * d, d);
          }
        }
        break;
      case ExpertPath::OnednnBatched:
        if (bf16) {
          hyla::gemm_batched(E, hyla::Trans::N, hyla::Trans::T, per, 2 * w, d, 1.0f, gathered16.data(), d, per * d,
                             w16, d, stride, 0.0f, gu.data(), 2 * w, per * 2 * w);
          hyla::gemm_batched(E, hyla::Trans::N, hyla::Trans::T, per, d, w, 1.0f, h16.data(), w, per * w,
                             w16 + 2 * d * w, w, stride, 0.0f, out.data(), d, per * d);
        } else {
          hyla::gemm_batched(E, hyla::Trans::N, hyla::Trans::T, per, 2 * w, d, 1.0f, gathered.data(), d, per * d,
                             w32, d, stride, 0.0f, gu.data(), 2 * w, per * 2 * w);
          hyla::gemm_batched(E, hyla::Trans::N, hyla::Trans::T, per, d, w, 1.0f, gu.data(), 2 * w, per * 2 * w,
                             w32 + 2 * d * w, w, stride, 0.0f, out.data(), d, per * d);
        }
        break;
      case ExpertPath::SmallGemmBlocks:
        layer.experts.forward(x.data(), dispatch, 0, E, precision, {}, out.data(), workspace);
        break;
    }
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * 3.0 * double(d * w * slots) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["is_square"] = 0;
  state.counters["kind"] = precision == Precision::BF16;
}

void register_all() {
  for (int kind = 0; kind < 2; ++kind) {
    const std::string dt = kind ? "bf16" : "f32";
    const Precision p = kind ? Precision::BF16 : Precision::F32;
    auto reg = [&](const std::string& name, auto fn) {
      benchmark::RegisterBenchmark((dt + "/" + name).c_str(), fn)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
    };
    reg("square_2048", [=](benchmark::State& s) { BM_square(s, kind); });
    for (int64_t n : {4096, 1024}) {
      reg("moe_" + std::to_string(n) + "/fwd", [=](benchmark::State& s) { BM_layer(s, n, p, false); });
      reg("moe_" + std::to_string(n) + "/fwd_bwd", [=](benchmark::State& s) { BM_layer(s, n, p, true); });
    }
    reg("experts/onednn_per_expert", [=](benchmark::State& s) { BM_experts(s, ExpertPath::OnednnPerExpert, p); });
    reg("experts/onednn_batched", [=](benchmark::State& s) { BM_experts(s, ExpertPath::OnednnBatched, p); });
    reg("experts/small_gemm_blocks", [=](benchmark::State& s) { BM_experts(s, ExpertPath::SmallGemmBlocks, p); });
  }
}

// Adds each row's GFLOP/s as a fraction of the square product of the same dtype, and prints a
// markdown table of all rows at the end (for BENCHMARKS.md).
class RatioReporter : public hyla::bench::SquareRatioReporter {
 public:
  RatioReporter() : SquareRatioReporter("| case | ms | GFLOP/s | vs square | max/mean load |\n|---|---|---|---|---|\n") {}

 protected:
  std::string row(Run& r) override {
    const double rate = add_vs_square(r);
    char line[256];
    const auto balance = r.counters.find("max_over_mean");
    std::snprintf(line, sizeof line, "| %s | %.2f | %.0f | %.2f | %s |\n", short_name(r).c_str(), r.GetAdjustedRealTime(),
                  rate, r.counters["vs_square"].value,
                  balance == r.counters.end() ? "" : std::to_string(balance->second.value).substr(0, 4).c_str());
    return line;
  }
};

}  // namespace

int main(int argc, char** argv) {
  hyla::set_threads(hyla::resolve_threads(0));
  benchmark::Initialize(&argc, argv);
  register_all();
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
