// Products straight from ggml blocks (kernels/ggml_gemm.h) per type, against hyla's int8 product
// (int8_gemm.h, block 32: the file's Q8_0 as hyla repacks it) on the same shape, for 1 row of x
// (decode: the weights' memory traffic bounds it) and 512 rows (prefill). Weights are cold: every
// iteration takes the next of enough copies to fill 64 MB (twice the L3 cache). Rows report the
// weight bytes read per second as a fraction of a streaming read measured first in the same run,
// GOP/s (2·n·out·in), and the time relative to the int8 row of the same shape and n.
// Run it with OMP_NUM_THREADS=1 for the one-thread figures.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "markdown_reporter.h"
#include "random_inputs.h"
#include "hyla/core/arith.h"
#include "hyla/core/memory.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/ggml_gemm.h"
#include "hyla/kernels/int8_gemm.h"

namespace {

using hyla::bench::random_vector;
using namespace hyla;

constexpr int64_t kColdBytes = int64_t(64) << 20, kOut = 2048, kIn = 2048;
double read_gbs = 0;

// Random blocks of `type` with finite values (seeded): a matrix [kOut, kIn].
std::vector<uint8_t> random_blocks(GgmlType type) {
  std::mt19937_64 rng(uint64_t(type) + 1);
  const int64_t bv = ggml_block_values(type), bb = ggml_block_bytes(type);
  std::vector<uint8_t> out(ggml_bytes(type, kOut * kIn));
  std::vector<float> y(static_cast<size_t>(bv));
  for (int64_t b = 0; b < kOut * kIn / bv; ++b) {
    uint8_t* block = out.data() + b * bb;
    do {
      for (int64_t i = 0; i < bb; ++i) block[i] = uint8_t(rng());
      ggml_to_f32(type, block, y.data(), bv);
    } while (!std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v) && std::fabs(v) < 1e3f; }));
  }
  return out;
}

// Enough copies of one matrix to fill kColdBytes.
struct Copies {
  std::shared_ptr<void> data;
  int64_t bytes = 0, count = 0;
  Copies(const uint8_t* one, int64_t one_bytes) : bytes(round_up(one_bytes, 64)) {
    count = std::max<int64_t>(2, kColdBytes / bytes);
    data = allocate_aligned(size_t(bytes * count));
    for (int64_t i = 0; i < count; ++i) std::copy_n(one, one_bytes, static_cast<uint8_t*>(data.get()) + i * bytes);
  }
  const uint8_t* at(int64_t i) const { return static_cast<const uint8_t*>(data.get()) + i * bytes; }
};

void BM_ggml(benchmark::State& state, GgmlType type, int64_t n) {
  const std::vector<uint8_t> one = random_blocks(type);
  const Copies copies(one.data(), int64_t(one.size()));
  const auto x = random_vector(n * kIn, 2);
  std::vector<float> y(size_t(n * kOut));
  const auto workspace = allocate_aligned(size_t(ggml_matmul_bytes(n, kIn, num_threads())));
  int64_t i = 0;
  auto run = [&] {
    const GgmlMatrix w{copies.at(i), type, kOut, kIn};
    ggml_matmul(x.data(), n, kIn, {&w, 1}, y.data(), kOut, 0.0f, workspace.get());
    i = (i + 1) % copies.count;
  };
  for (int64_t warm = 0; warm < copies.count; ++warm) run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weight_GBs"] =
      benchmark::Counter(double(one.size()) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GOPs"] =
      benchmark::Counter(2.0 * double(n * kOut * kIn) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_int8(benchmark::State& state, int64_t n) {
  constexpr int64_t kBlock = 32;
  std::vector<int8_t> values(size_t(kOut * kIn));
  std::vector<float> scales(size_t(kOut * kIn / kBlock));
  const auto w = random_vector(kOut * kIn, 1, 0.02f);
  quantize_int8_weights(w.data(), kOut, kIn, kBlock, values.data(), scales.data());
  const int64_t packed = int8_packed_bytes(kOut, kIn, kBlock);
  const auto one = allocate_aligned(size_t(packed));  // int8_pack stores aligned
  int8_pack(values.data(), scales.data(), kOut, kIn, kBlock, static_cast<uint8_t*>(one.get()));
  const Copies copies(static_cast<const uint8_t*>(one.get()), packed);
  const auto x = random_vector(n * kIn, 2);
  std::vector<float> y(size_t(n * kOut));
  const auto workspace = allocate_aligned(size_t(int8_rows_bytes(n, kIn, kBlock)));
  int64_t i = 0;
  auto run = [&] {
    const Int8PackedMatrix m{copies.at(i), kOut, kIn, kBlock};
    int8_matmul(x.data(), n, kIn, {&m, 1}, y.data(), kOut, 0.0f, workspace.get());
    i = (i + 1) % copies.count;
  };
  for (int64_t warm = 0; warm < copies.count; ++warm) run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["weight_GBs"] = benchmark::Counter(double(packed) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GOPs"] =
      benchmark::Counter(2.0 * double(n * kOut * kIn) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

const GgmlType kTypes[] = {GgmlType::Q8_0,   GgmlType::Q6_K,    GgmlType::Q5_K,   GgmlType::Q4_K,  GgmlType::Q3_K,
                           GgmlType::Q2_K,   GgmlType::IQ4_XS,  GgmlType::IQ3_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_XXS,
                           GgmlType::IQ1_M,  GgmlType::IQ1_S,   GgmlType::MXFP4};

void register_all() {
  for (const int64_t n : {1, 512}) {
    benchmark::RegisterBenchmark(fmt::format("int8/n{}", n).c_str(), [=](benchmark::State& st) { BM_int8(st, n); })
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.3)
        ->UseRealTime();
    for (GgmlType t : kTypes)
      benchmark::RegisterBenchmark(fmt::format("{}/n{}", ggml_type_name(uint32_t(t)), n).c_str(),
                                   [=](benchmark::State& st) { BM_ggml(st, t, n); })
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3)
          ->UseRealTime();
  }
}

class GgmlReporter : public hyla::bench::MarkdownReporter {
 public:
  GgmlReporter()
      : MarkdownReporter("| product (2048×2048) | µs | weight GB/s (of read) | GOP/s | time ÷ int8's |\n|---|---|---|---|---|\n") {}

 protected:
  std::string row(Run& r) override {
    const std::string name = short_name(r);
    const std::string n = name.substr(name.find('/') + 1);
    const double us = r.GetAdjustedRealTime(), rate = r.counters["weight_GBs"].value;
    r.counters["vs_read"] = rate / read_gbs;
    if (name.starts_with("int8/")) int8_us_[n] = us;
    const std::string ratio = int8_us_.count(n) ? fmt::format("{:.2f}", us / int8_us_[n]) : "";
    return fmt::format("| {} | {:.1f} | {:.1f} ({:.0f}%) | {:.1f} | {} |\n", name, us, rate, 100 * rate / read_gbs,
                       r.counters["GOPs"].value, ratio);
  }

 private:
  std::map<std::string, double> int8_us_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  read_gbs = measure_read_bandwidth_gbs();
  std::printf("references (this run, %d threads): streaming read %.1f GB/s\n", omp_get_max_threads(), read_gbs);
  register_all();
  GgmlReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
