// int8 weights (docs/quantization.md) against bf16 on the projection shapes of configs/small.json:
// y = x·Wᵀ through Linear, as the model runs it, for 1, 4 and 16 rows of x (decode and small
// batches: the weights' memory traffic bounds them) and 512 rows (prefill: compute-bound). int8:
// kernels/int8_gemm.h, quantising x inside; bf16: oneDNN through hyla::gemm on the weights' bf16
// copies, rounding x to bf16 inside. Weights are cold: every iteration takes the next of enough
// copies to fill 64 MB (twice the L3 cache), as a model's many layers do.
//
// References measured first in the same run: a streaming read (GB/s) and oneDNN's 2048³ bf16 GEMM
// (GFLOP/s). Each row reports weight GB/s (the weight bytes one product reads: int8 values and
// scales, or bf16 values) as a fraction of the streaming read, GOP/s (2·n·out·in) as a fraction of
// the bf16 GEMM, and int8 rows their speed-up over the bf16 row of the same shape. `portable` rows
// force the portable int8 kernels (what an x86-64-v2 build runs; the native ones are AVX-512
// VNNI or AVX2). `experts/...` rows time the MoE layer's routed experts (128 experts of width
// 128, top-4, balanced) on 4 and 512 tokens, hot.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <omp.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "markdown_reporter.h"
#include "random_inputs.h"
#include "hyla/core/memory.h"
#include "hyla/kernels/backend.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/model_files.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/layers.h"
#include "hyla/model/moe_experts.h"

namespace {

using hyla::bench::random_vector;
using namespace hyla;

constexpr int64_t kBlock = 32, kColdBytes = int64_t(64) << 20;
double read_gbs = 0, bf16_peak_gflops = 0;

void measure_references() {
  bf16_peak_gflops = measure_gemm_peak_gflops(true);
  read_gbs = measure_read_bandwidth_gbs();
  std::printf("references (this run, %d threads): streaming read %.1f GB/s, oneDNN 2048^3 bf16 %.0f GFLOP/s; int8 "
              "kernels: %s\n",
              omp_get_max_threads(), read_gbs, bf16_peak_gflops, int8_native_kernels() ? kernel_backend_name() : "portable");
}

// Marks every int8-capable parameter of a store int8 before allocation, and afterwards fills them
// with the quantised values of random weights.
void plan_int8(ParamStore& store) {
  for (const auto& p : store.params())
    if (p->int8_allowed) p->int8_block = kBlock;
}

void fill_int8(ParamStore& store) {
  std::map<std::pair<int64_t, int64_t>, std::pair<std::vector<int8_t>, std::vector<float>>> quantized;
  for (const auto& p : store.params()) {
    if (!p->is_int8()) continue;
    const int64_t rows = p->shape[0], cols = p->shape[1];
    auto& [values, scales] = quantized[{rows, cols}];
    if (values.empty()) {
      values.resize(size_t(rows * cols)), scales.resize(size_t(rows * cols / kBlock));
      const auto w = random_vector(rows * cols, uint32_t(rows + cols), 0.02f);
      quantize_int8_weights(w.data(), rows, cols, kBlock, values.data(), scales.data());
    }
    int8_pack(values.data(), scales.data(), rows, cols, kBlock, const_cast<uint8_t*>(p->int8.data));
  }
}

// Copies of one [out, in] weight as Linears, int8 or float (bf16 copies used).
struct Weights {
  ParamStore store;
  std::vector<Linear> copies;
  int64_t bytes = 0;  // one copy's weight bytes read by a product
  Weights(int64_t out, int64_t in, bool int8) {
    bytes = int8 ? int8_packed_bytes(out, in, kBlock) : out * in * 2;
    const int64_t count = std::max<int64_t>(2, kColdBytes / bytes);
    for (int64_t i = 0; i < count; ++i) copies.emplace_back(store, fmt::format("w{}", i), in, out, Component::Kda);
    if (int8) plan_int8(store);
    store.allocate();
    if (int8) {
      fill_int8(store);
    } else {
      const auto w = random_vector(out * in, 1, 0.02f);
      for (const auto& p : store.params()) std::copy(w.begin(), w.end(), p->v());
      store.refresh_bf16();
    }
  }
};

struct Shape {
  const char* name;
  int64_t out, in;
};
// configs/small.json: KDA's fused [q k v f g b] input projection, a 512 → 512 projection (o_proj,
// MLA q and g), a routed expert's [gate; up] and down, the LM head.
const Shape kShapes[] = {{"kda_in_fused", 2568, 512},
                         {"proj_512", 512, 512},
                         {"expert_gate_up", 256, 512},
                         {"expert_down", 512, 128},
                         {"lm_head", 8192, 512}};

enum class Kind { Bf16, Int8, Int8Portable };

// The weights of the shape being measured, int8 and float, built once per shape (Google
// Benchmark calls a benchmark function several times).
Weights& weights_for(const Shape& shape, bool int8) {
  static std::unique_ptr<Weights> cached[2];
  static const char* cached_shape[2] = {nullptr, nullptr};
  if (cached_shape[int8] != shape.name) {
    cached[int8].reset();
    cached[int8] = std::make_unique<Weights>(shape.out, shape.in, int8);
    cached_shape[int8] = shape.name;
  }
  return *cached[int8];
}

void BM_product(benchmark::State& state, Shape shape, int64_t n, Kind kind) {
  Weights& weights = weights_for(shape, kind != Kind::Bf16);
  const auto x = random_vector(n * shape.in, 2);
  std::vector<float> y(size_t(n * shape.out));
  const auto workspace = allocate_aligned(size_t(int8_rows_bytes(n, shape.in, kBlock)));
  size_t i = 0;
  auto run = [&] {
    const Linear& w = weights.copies[i];
    if (kind == Kind::Int8Portable) {
      const Int8PackedMatrix m = w.param().int8;
      int8_matmul(x.data(), n, shape.in, {&m, 1}, y.data(), shape.out, 0.0f, workspace.get(), Int8Kernel::Portable);
    } else {
      w.forward(x.data(), n, y.data(), Precision::BF16);
    }
    i = (i + 1) % weights.copies.size();
  };
  for (size_t warm = 0; warm < weights.copies.size(); ++warm) run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weight_GBs"] =
      benchmark::Counter(double(weights.bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GOPs"] =
      benchmark::Counter(2.0 * double(n * shape.out * shape.in) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The MoE layer's routed experts (RoutedExperts::forward, no saving) on `tokens` tokens routed
// round-robin (every expert gets tokens·k/E slots).
void BM_experts(benchmark::State& state, int64_t tokens, bool int8) {
  const ModelConfig config = model_config_of(std::string(HYLA_SOURCE_DIR) + "/configs/small.json");
  const MoeConfig& m = config.moe;
  const int64_t E = m.num_experts, k = m.num_experts_per_tok, d = config.hidden_size;
  ParamStore store;
  RoutedExperts experts(store, "mlp.", config, d);
  if (int8) plan_int8(store);
  store.allocate();
  if (int8) {
    fill_int8(store);
  } else {
    const auto w = random_vector(3 * d * m.moe_intermediate_size, 1, 0.02f);
    for (const auto& p : store.params()) std::copy(w.begin(), w.begin() + p->numel(), p->v());
    store.refresh_bf16();
  }
  std::vector<int32_t> selected(size_t(tokens * k));
  std::vector<float> weights(size_t(tokens * k), 1.0f / float(k));
  for (int64_t s = 0; s < tokens * k; ++s) selected[size_t(s)] = int32_t(s % E);
  Routing routing{tokens, E, k, nullptr, selected.data(), weights.data()};
  ExpertDispatch dispatch;
  dispatch.build(routing);
  const auto x = random_vector(tokens * d, 3);
  std::vector<float> out(size_t(tokens * k * d));
  Workspace workspace;
  experts.forward(x.data(), dispatch, 0, E, Precision::BF16, {}, out.data(), workspace);
  for (auto _ : state) {
    experts.forward(x.data(), dispatch, 0, E, Precision::BF16, {}, out.data(), workspace);
    benchmark::DoNotOptimize(out.data());
  }
  const double macs = 3.0 * double(d * m.moe_intermediate_size) * double(tokens * k);
  state.counters["GOPs"] = benchmark::Counter(2.0 * macs * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

const char* kind_name(Kind kind) { return kind == Kind::Bf16 ? "bf16" : kind == Kind::Int8 ? "int8" : "portable"; }

void register_all() {
  for (const Shape& s : kShapes)
    for (const int64_t n : {1, 4, 16, 512})
      for (const Kind kind : {Kind::Bf16, Kind::Int8})
        benchmark::RegisterBenchmark(fmt::format("{}/{}/n{}", kind_name(kind), s.name, n).c_str(),
                                     [=](benchmark::State& st) { BM_product(st, s, n, kind); })
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.3)
            ->UseRealTime();
  for (const int64_t n : {1, 512})
    benchmark::RegisterBenchmark(fmt::format("portable/kda_in_fused/n{}", n).c_str(),
                                 [=](benchmark::State& st) { BM_product(st, kShapes[0], n, Kind::Int8Portable); })
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.3)
        ->UseRealTime();
  for (const int64_t tokens : {4, 512})
    for (const bool int8 : {false, true})
      benchmark::RegisterBenchmark(fmt::format("{}/experts/tokens{}", int8 ? "int8" : "bf16", tokens).c_str(),
                                   [=](benchmark::State& st) { BM_experts(st, tokens, int8); })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3)
          ->UseRealTime();
}

// Adds the fractions of the references and int8's speed-up over bf16 (same shape and rows), and
// prints a markdown table at the end (for BENCHMARKS.md).
class Int8Reporter : public hyla::bench::MarkdownReporter {
 public:
  Int8Reporter()
      : MarkdownReporter(
            "| product | µs | weight GB/s (of read) | GOP/s (of bf16 peak) | int8 speed-up |\n|---|---|---|---|---|\n") {}

 protected:
  std::string row(Run& r) override {
    const std::string name = short_name(r);
    const std::string kind = name.substr(0, name.find('/')), shape = name.substr(name.find('/') + 1);
    const double us = r.GetAdjustedRealTime();
    std::string gbs = "", speedup = "";
    if (r.counters.count("weight_GBs")) {
      const double rate = r.counters["weight_GBs"].value;
      r.counters["vs_read"] = rate / read_gbs;
      gbs = fmt::format("{:.1f} ({:.0f}%)", rate, 100 * rate / read_gbs);
    }
    const double gops = r.counters["GOPs"].value;
    r.counters["vs_bf16_peak"] = gops / bf16_peak_gflops;
    if (kind == "bf16") {
      bf16_us_[shape] = us;
    } else if (bf16_us_.count(shape)) {
      r.counters["speedup"] = bf16_us_[shape] / us;
      speedup = fmt::format("{:.2f}", bf16_us_[shape] / us);
    }
    return fmt::format("| {} | {:.2f} | {} | {:.0f} ({:.0f}%) | {} |\n", name, us, gbs, gops, 100 * gops / bf16_peak_gflops,
                       speedup);
  }

 private:
  std::map<std::string, double> bf16_us_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  measure_references();
  register_all();
  Int8Reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
