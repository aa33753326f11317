// What an expert-cache miss costs (model/expert_offload.h, docs/offload.md), on one thread, for one
// routed expert of configs/small.json (d 512, width 128, int8 block 32: 221,184 packed bytes):
//   pack/…     int8_pack of the expert's three matrices from the file layout (row-major int8
//              values and f32 scales, as the page cache holds them) into a cache slot — what a
//              fetch does;
//   compute/…  the expert on one token from its packed weights (quantise the row, [gate; up],
//              swiglu, down) — what a hit costs, and what a miss computed straight from the
//              weights would cost at best (it reads the same bytes once);
//   direct/…   the same product straight from the file layout with plain loops the compiler
//              vectorises (int8 · int8 summed per block in int32, scaled in f32) — what a miss
//              costs that computes the expert without packing it (and leaves nothing resident);
//   direct_vnni/…  the same with AVX-512 VNNI on the row-major layout: x as unsigned q_x + 128
//              against the signed weights, the 128 · Σ w correction from a second vpdpbusd with ones,
//              two blocks of 32 per 64-byte load — a kernel written only to bound the direct path.
// `cold` rows take the next of enough copies to exceed the last-level cache (512 MB); `hot` rows
// reuse one. The reference, measured first in the same process: a one-thread streaming read of a
// fresh 512 MB buffer (GB/s).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "random_inputs.h"
#include "hyla/core/simd.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/bandwidth.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/model/int8_weights.h"

namespace {

using namespace hyla;

constexpr int64_t kIn = 512, kWidth = 128, kBlock = 32, kColdBytes = int64_t(512) << 20;
double read_gbs = 0;

struct FileExpert {  // one expert as a model file stores it
  std::vector<int8_t> values[3];
  std::vector<float> scales[3];
};

const int64_t kRows[3] = {kWidth, kWidth, kIn}, kCols[3] = {kIn, kIn, kWidth};

int64_t packed_bytes() {
  int64_t total = 0;
  for (int m = 0; m < 3; ++m) total += int8_packed_bytes(kRows[m], kCols[m], kBlock);
  return total;
}

int64_t file_bytes() {
  int64_t total = 0;
  for (int m = 0; m < 3; ++m) total += kRows[m] * kCols[m] + kRows[m] * kCols[m] / kBlock * 4;
  return total;
}

const std::vector<FileExpert>& file_experts() {
  static const std::vector<FileExpert> experts = [] {
    std::vector<FileExpert> out(size_t(kColdBytes / file_bytes()));
    for (size_t i = 0; i < out.size(); ++i)
      for (int m = 0; m < 3; ++m) {
        const auto w = bench::random_vector(kRows[m] * kCols[m], uint32_t(3 * i + m), 0.02f);
        out[i].values[m].resize(w.size()), out[i].scales[m].resize(w.size() / kBlock);
        quantize_int8_weights(w.data(), kRows[m], kCols[m], kBlock, out[i].values[m].data(), out[i].scales[m].data());
      }
    return out;
  }();
  return experts;
}

// Packs expert `e` into dst; returns its three matrices.
std::array<Int8PackedMatrix, 3> pack(const FileExpert& e, uint8_t* dst) {
  std::array<Int8PackedMatrix, 3> out;
  for (int m = 0; m < 3; ++m) {
    int8_pack(e.values[m].data(), e.scales[m].data(), kRows[m], kCols[m], kBlock, dst);
    out[size_t(m)] = {dst, kRows[m], kCols[m], kBlock};
    dst += int8_packed_bytes(kRows[m], kCols[m], kBlock);
  }
  return out;
}

void BM_PackExpert(benchmark::State& state) {
  const bool cold = state.range(0) != 0;
  const auto& experts = file_experts();
  const auto slot = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(std::aligned_alloc(64, size_t(packed_bytes()))), std::free);
  size_t next = 0;
  for (auto _ : state) {
    pack(experts[cold ? next : 0], slot.get());
    next = (next + 1) % experts.size();
    benchmark::ClobberMemory();
  }
  const double bytes = double(file_bytes());
  state.counters["file_GBs"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_read"] = benchmark::Counter(bytes * 1e-9 / read_gbs, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ComputeExpert(benchmark::State& state) {
  const bool cold = state.range(0) != 0;
  const auto& experts = file_experts();
  const int64_t copies = cold ? int64_t(experts.size()) : 1, bytes = packed_bytes();
  const auto packed = std::shared_ptr<uint8_t[]>(static_cast<uint8_t*>(std::aligned_alloc(64, size_t(copies * bytes))), std::free);
  std::vector<std::array<Int8PackedMatrix, 3>> matrices;
  for (int64_t i = 0; i < copies; ++i) matrices.push_back(pack(experts[size_t(i)], packed.get() + i * bytes));
  const auto x = bench::random_vector(kIn, 7, 1.0f);
  std::vector<float> gu(2 * kWidth), h(kWidth), y(kIn);
  std::vector<uint8_t> rows(size_t(int8_rows_bytes(1, kIn, kBlock)));
  size_t next = 0;
  for (auto _ : state) {
    const auto& m = matrices[next];
    const Int8Rows xq = int8_rows_view(rows.data(), 1, kIn, kBlock);
    quantize_int8_rows(x.data(), kIn, xq, 0, 1);
    int8_matmul_rows(xq, {m.data(), 2}, gu.data(), 2 * kWidth, 0.0f);
    gated_activation_forward(GatedActivation{}, gu.data(), 1, kWidth, h.data());
    const Int8Rows hq = int8_rows_view(rows.data(), 1, kWidth, kBlock);
    quantize_int8_rows(h.data(), kWidth, hq, 0, 1);
    int8_matmul_rows(hq, {&m[2], 1}, y.data(), kIn, 0.0f);
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % matrices.size();
  }
  state.counters["weight_GBs"] = benchmark::Counter(double(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_read"] =
      benchmark::Counter(double(bytes) * 1e-9 / read_gbs, benchmark::Counter::kIsIterationInvariantRate);
}

// y[r] = Σ_b s_w[r, b] s_x[b] Σ_k q_w[r, b·B + k] q_x[b·B + k] for one quantised row x.
void direct_product(const Int8Rows& x, const int8_t* values, const float* scales, int64_t rows, int64_t cols, float* y) {
  const int64_t blocks = cols / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* w = values + r * cols;
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t dot = 0;
      for (int64_t k = 0; k < kBlock; ++k) dot += int32_t(w[b * kBlock + k]) * int32_t(x.values[b * kBlock + k]);
      acc += float(dot) * scales[r * blocks + b] * x.scales[b];
    }
    y[r] = acc;
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// direct_product's result for block 32 (summed in another order).
void direct_product_vnni(const Int8Rows& x, const int8_t* values, const float* scales, int64_t rows, int64_t cols,
                         float* y) {
  static_assert(kBlock == 32);
  const int64_t chunks = cols / 64, blocks = cols / kBlock;
  alignas(64) uint8_t xu[512];
  alignas(64) float sx[8 * 16];
  for (int64_t i = 0; i < cols; ++i) xu[i] = uint8_t(int(x.values[i]) + 128);
  for (int64_t c = 0; c < chunks; ++c)
    for (int j = 0; j < 16; ++j) sx[c * 16 + j] = x.scales[2 * c + j / 8];
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* w = values + r * cols;
    const float* sw = scales + r * blocks;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512i wv = _mm512_loadu_si512(w + 64 * c);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(xu + 64 * c), wv);
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, wv);
      const __m512 exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot, _mm512_slli_epi32(sum, 7)));
      double two_scales;
      std::memcpy(&two_scales, sw + 2 * c, sizeof two_scales);
      const __m512 w_scale = _mm512_permutexvar_ps(pair, _mm512_castpd_ps(_mm512_set1_pd(two_scales)));
      acc = _mm512_fmadd_ps(exact, _mm512_mul_ps(w_scale, _mm512_load_ps(sx + 16 * c)), acc);
    }
    y[r] = _mm512_reduce_add_ps(acc);
  }
}
#endif

template <auto Product>
void BM_DirectExpert(benchmark::State& state) {
  const bool cold = state.range(0) != 0;
  const auto& experts = file_experts();
  const auto x = bench::random_vector(kIn, 7, 1.0f);
  std::vector<float> gu(2 * kWidth), h(kWidth), y(kIn);
  std::vector<uint8_t> rows(size_t(int8_rows_bytes(1, kIn, kBlock)));
  size_t next = 0;
  for (auto _ : state) {
    const FileExpert& e = experts[cold ? next : 0];
    const Int8Rows xq = int8_rows_view(rows.data(), 1, kIn, kBlock);
    quantize_int8_rows(x.data(), kIn, xq, 0, 1);
    Product(xq, e.values[0].data(), e.scales[0].data(), kWidth, kIn, gu.data());
    Product(xq, e.values[1].data(), e.scales[1].data(), kWidth, kIn, gu.data() + kWidth);
    gated_activation_forward(GatedActivation{}, gu.data(), 1, kWidth, h.data());
    const Int8Rows hq = int8_rows_view(rows.data(), 1, kWidth, kBlock);
    quantize_int8_rows(h.data(), kWidth, hq, 0, 1);
    Product(hq, e.values[2].data(), e.scales[2].data(), kIn, kWidth, y.data());
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % experts.size();
  }
  const double bytes = double(file_bytes());
  state.counters["file_GBs"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_read"] = benchmark::Counter(bytes * 1e-9 / read_gbs, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_PackExpert)->ArgName("cold")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ComputeExpert)->ArgName("cold")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_DirectExpert, direct_product)->Name("BM_DirectExpert")->ArgName("cold")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
BENCHMARK_TEMPLATE(BM_DirectExpert, direct_product_vnni)->Name("BM_DirectExpertVnni")->ArgName("cold")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
#endif

}  // namespace

int main(int argc, char** argv) {
  hyla::set_threads(1);
  read_gbs = hyla::measure_read_bandwidth_gbs();
  std::printf("one-thread read bandwidth of a fresh 512 MB buffer: %.1f GB/s; expert: %lld packed bytes, %lld in the file\n",
              read_gbs, (long long)packed_bytes(), (long long)file_bytes());
  file_experts();
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  {  // the two direct products agree (up to the order of the f32 sums)
    const FileExpert& e = file_experts()[0];
    const auto x = bench::random_vector(kIn, 7, 1.0f);
    std::vector<uint8_t> rows(size_t(int8_rows_bytes(1, kIn, kBlock)));
    const Int8Rows xq = int8_rows_view(rows.data(), 1, kIn, kBlock);
    quantize_int8_rows(x.data(), kIn, xq, 0, 1);
    std::vector<float> a(kWidth), b(kWidth);
    direct_product(xq, e.values[0].data(), e.scales[0].data(), kWidth, kIn, a.data());
    direct_product_vnni(xq, e.values[0].data(), e.scales[0].data(), kWidth, kIn, b.data());
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < kWidth; ++i) diff = std::max(diff, double(std::fabs(a[i] - b[i]))), scale = std::max(scale, double(std::fabs(a[i])));
    std::printf("direct products: VNNI vs plain loops differ by %.2e of the largest output\n", diff / scale);
    if (diff > 1e-5 * scale) return 1;
  }
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
