// MXFP4 routed experts (kernels/mxfp4_gemm.h) against int8 (kernels/int8_gemm.h) on one thread, as
// RoutedExperts runs an expert: y = x·Wᵀ for configs/kimi-k3-small.json's expert shapes ([gate; up]
// 2×128 × 256, down 256 × 128) and Kimi-Linear-48B's ([gate; up] 2×1024 × 2304, down 2304 × 1024), for
// 1, 4, 32 and 256 rows of x (a decoded token's expert, small and large prefill blocks). Weights
// are cold: every iteration takes the next of enough copies to fill 64 MB (twice the L3 cache),
// as a model's many experts do. int8 and mxfp4-q8 quantise x inside (as the bf16 forward does);
// mxfp4-f32 reads x as f32 (the exact f32 forward).
//
// The reference measured first in the same run is a one-thread streaming read (GB/s). Each row
// reports weight GB/s (the packed bytes one product reads: 4.25 bits a weight for MXFP4, 9 for
// int8 with block 32) and its fraction of that read; `avx2` and `portable` rows force those
// MXFP4 kernels.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "markdown_reporter.h"
#include "random_inputs.h"
#include "hyla/core/arith.h"
#include "hyla/core/memory.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/mxfp4_weights.h"

namespace {

using hyla::bench::random_vector;
using namespace hyla;

constexpr int64_t kBlock = 32, kColdBytes = int64_t(64) << 20;
double read_gbs = 0;

enum class Kind { Int8, Mxfp4Q8, Mxfp4, Mxfp4Avx2, Mxfp4Portable };
const char* kind_name(Kind k) {
  return k == Kind::Int8      ? "int8"
         : k == Kind::Mxfp4Q8 ? "mxfp4-q8"
         : k == Kind::Mxfp4   ? "mxfp4-f32"
         : k == Kind::Mxfp4Avx2 ? "mxfp4-f32-avx2"
                                : "mxfp4-f32-portable";
}

struct Shape {
  const char* name;
  int64_t out, in;
  int parts;  // [gate; up] is two parts of `out` rows each
};
const Shape kShapes[] = {{"k3small_gate_up", 128, 256, 2},
                         {"k3small_down", 256, 128, 1},
                         {"linear48b_gate_up", 1024, 2304, 2},
                         {"linear48b_down", 2304, 1024, 1}};

// Copies of one expert matrix (its parts), packed int8 or MXFP4, in one buffer.
struct Copies {
  std::shared_ptr<void> memory;
  int64_t part_bytes = 0, count = 0;
  Copies(const Shape& s, bool int8) {
    part_bytes = round_up(int8 ? int8_packed_bytes(s.out, s.in, kBlock) : mxfp4_packed_bytes(s.out, s.in), 64);
    count = std::max<int64_t>(2, kColdBytes / (part_bytes * s.parts));
    memory = allocate_aligned(size_t(part_bytes * s.parts * count));
    const auto w = random_vector(s.out * s.in, uint32_t(s.out + s.in), 0.02f);
    uint8_t* packed = static_cast<uint8_t*>(memory.get());  // the first copy's first part, copied on
    if (int8) {
      std::vector<int8_t> values(size_t(s.out * s.in));
      std::vector<float> scales(size_t(s.out * s.in / kBlock));
      quantize_int8_weights(w.data(), s.out, s.in, kBlock, values.data(), scales.data());
      int8_pack(values.data(), scales.data(), s.out, s.in, kBlock, packed);
    } else {
      std::vector<uint8_t> codes(size_t(s.out * s.in / 2)), scales(size_t(s.out * s.in / 32));
      quantize_mxfp4_weights(w.data(), s.out, s.in, codes.data(), scales.data());
      mxfp4_pack(codes.data(), scales.data(), s.out, s.in, packed);
    }
    for (int64_t i = 1; i < count * s.parts; ++i) std::memcpy(packed + i * part_bytes, packed, size_t(part_bytes));
  }
  const uint8_t* part(int64_t copy, int p, int parts) const {
    return static_cast<const uint8_t*>(memory.get()) + (copy * parts + p) * part_bytes;
  }
};

void BM_product(benchmark::State& state, Shape s, int64_t n, Kind kind) {
  const bool int8 = kind == Kind::Int8;
  const Copies copies(s, int8);
  const auto x = random_vector(n * s.in, 2);
  std::vector<float> y(size_t(n * s.out * s.parts));
  const auto workspace =
      allocate_aligned(size_t(std::max(int8_rows_bytes(n, s.in, kBlock), mxfp4_q8_rows_bytes(n, s.in))));
  const Mxfp4Kernel kernel = kind == Kind::Mxfp4Avx2 ? Mxfp4Kernel::Avx2
                             : kind == Kind::Mxfp4Portable ? Mxfp4Kernel::Portable
                                                            : Mxfp4Kernel::Native;
  int64_t i = 0;
  auto run = [&] {
    if (int8) {
      Int8PackedMatrix parts[2];
      for (int p = 0; p < s.parts; ++p) parts[p] = {copies.part(i, p, s.parts), s.out, s.in, kBlock};
      const Int8Rows xq = int8_rows_view(workspace.get(), n, s.in, kBlock);
      quantize_int8_rows(x.data(), s.in, xq, 0, n);
      int8_matmul_rows(xq, {parts, size_t(s.parts)}, y.data(), s.out * s.parts, 0.0f);
    } else {
      Mxfp4PackedMatrix parts[2];
      for (int p = 0; p < s.parts; ++p) parts[p] = {copies.part(i, p, s.parts), s.out, s.in};
      if (kind == Kind::Mxfp4Q8)
        mxfp4_matmul_rows_q8(x.data(), n, s.in, {parts, size_t(s.parts)}, y.data(), s.out * s.parts, 0.0f,
                             workspace.get());
      else
        mxfp4_matmul_rows(x.data(), n, s.in, {parts, size_t(s.parts)}, y.data(), s.out * s.parts, 0.0f, kernel);
    }
    i = (i + 1) % copies.count;
  };
  for (int64_t warm = 0; warm < copies.count; ++warm) run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = double(copies.part_bytes * s.parts);
  state.counters["weight_GBs"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * double(n * s.out * s.parts * s.in) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  std::vector<Kind> kinds{Kind::Int8, Kind::Mxfp4Q8, Kind::Mxfp4};
  if (mxfp4_kernel_available(Mxfp4Kernel::Avx2)) kinds.push_back(Kind::Mxfp4Avx2);
  kinds.push_back(Kind::Mxfp4Portable);
  for (const Shape& s : kShapes)
    for (const int64_t n : {1, 4, 32, 256})
      for (const Kind kind : kinds) {
        if (kind == Kind::Mxfp4Portable && n > 4) continue;
        benchmark::RegisterBenchmark(fmt::format("{}/{}/n{}", kind_name(kind), s.name, n).c_str(),
                                     [=](benchmark::State& st) { BM_product(st, s, n, kind); })
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.2)
            ->UseRealTime();
      }
}

// Rows: time, weight GB/s with its fraction of the streaming read, GFLOP/s, and MXFP4 rows' speed-up
// over the int8 row of the same shape and rows.
class Mxfp4Reporter : public hyla::bench::MarkdownReporter {
 public:
  Mxfp4Reporter()
      : MarkdownReporter("| product | µs | weight GB/s (of read) | GFLOP/s | vs int8 |\n|---|---:|---:|---:|---:|\n") {}

 protected:
  std::string row(Run& r) override {
    const std::string name = short_name(r);
    const std::string kind = name.substr(0, name.find('/')), shape = name.substr(name.find('/') + 1);
    const double us = r.GetAdjustedRealTime(), rate = r.counters["weight_GBs"].value;
    r.counters["vs_read"] = rate / read_gbs;
    std::string speedup;
    if (kind == "int8") int8_us_[shape] = us;
    else if (int8_us_.count(shape)) speedup = fmt::format("{:.2f}", int8_us_[shape] / us), r.counters["vs_int8"] = int8_us_[shape] / us;
    return fmt::format("| {} | {:.2f} | {:.1f} ({:.0f}%) | {:.1f} | {} |\n", name, us, rate, 100 * rate / read_gbs,
                       r.counters["GFLOPs"].value, speedup);
  }

 private:
  std::map<std::string, double> int8_us_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  omp_set_num_threads(1);
  read_gbs = measure_read_bandwidth_gbs();
  std::printf("reference (this run, 1 thread): streaming read %.1f GB/s\n", read_gbs);
  register_all();
  Mxfp4Reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
}
