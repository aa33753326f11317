// Products straight from ggml blocks (kernels/ggml_gemm.h): every kernel, every quantised type,
// against a double-precision product of the decoded weights (io/ggml_types.h, bit for bit ggml's)
// and x rounded as the header says; and against unrounded x within that rounding's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "hyla/kernels/ggml_gemm.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/core/memory.h"
#include "hyla/core/threads.h"
#include "test_util.h"

namespace hyla {
namespace {

struct XorShift {
  uint64_t state;
  uint64_t next() {
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
};

// `rows` rows of random blocks whose values are finite, kept to magnitudes below 10^4.
std::vector<uint8_t> random_matrix(GgmlType type, int64_t rows, int64_t cols, XorShift& random) {
  const int64_t bv = ggml_block_values(type), bb = ggml_block_bytes(type);
  std::vector<uint8_t> out(size_t(rows * cols / bv * bb));
  std::vector<float> y(static_cast<size_t>(bv));
  for (int64_t b = 0; b < rows * cols / bv; ++b) {
    uint8_t* block = out.data() + b * bb;
    do {
      for (int64_t i = 0; i < bb; ++i) block[i] = uint8_t(random.next());
      ggml_to_f32(type, block, y.data(), bv);
    } while (!std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v) && std::fabs(v) < 1e4f; }));
  }
  return out;
}

std::vector<GgmlType> quantised_types() {
  std::vector<GgmlType> out;
  for (GgmlType t : ggml_readable_types())
    if (ggml_type_quantized(t)) out.push_back(t);
  return out;
}

std::vector<GgmlKernel> kernels() {
  std::vector<GgmlKernel> out;
  for (GgmlKernel k : {GgmlKernel::Native, GgmlKernel::Avx2, GgmlKernel::Portable})
    if (ggml_kernel_available(k)) out.push_back(k);
  return out;
}

// x as the kernels round it: per `block` values s = max|x| / 127, q = round to nearest even (x / s).
std::vector<double> rounded(const std::vector<float>& x, int64_t n, int64_t cols, int64_t block) {
  auto buffer = allocate_aligned(size_t(int8_rows_bytes(n, cols, block)));
  const Int8Rows q = int8_rows_view(buffer.get(), n, cols, block);
  quantize_int8_rows(x.data(), cols, q, 0, n, Int8Kernel::Portable);
  std::vector<double> out(x.size());
  for (int64_t i = 0; i < n * cols; ++i) out[size_t(i)] = double(q.scales[i / block]) * double(q.values[i]);
  return out;
}

// One product of `parts` (each `rows` × cols, its own type) with every kernel, against doubles.
void check_product(const std::vector<GgmlType>& types, int64_t rows, int64_t cols, int64_t n, float beta,
                   uint64_t seed) {
  XorShift random{seed};
  std::vector<std::vector<uint8_t>> data;
  std::vector<GgmlMatrix> parts;
  std::vector<std::vector<float>> decoded;
  for (GgmlType t : types) {
    data.push_back(random_matrix(t, rows, cols, random));
    decoded.emplace_back(size_t(rows * cols));
    ggml_to_f32(t, data.back().data(), decoded.back().data(), rows * cols);
  }
  for (size_t i = 0; i < types.size(); ++i) parts.push_back({data[i].data(), types[i], rows, cols});
  const int64_t out = rows * int64_t(types.size());
  std::vector<float> x(size_t(n * cols));
  for (float& v : x) v = float(random.uniform() * 2 - 1) * (random.uniform() < 0.05 ? 30.0f : 1.0f);
  // Per 256 values where every part's blocks are 256 values (ggml's Q8_K), else per 32.
  const bool all_256 = std::all_of(types.begin(), types.end(), [](GgmlType t) { return ggml_block_values(t) == 256; });
  const std::vector<double> xr = rounded(x, n, cols, all_256 ? 256 : 32);
  std::vector<float> y0(size_t(n * out));
  for (float& v : y0) v = float(random.uniform() - 0.5);
  auto workspace = allocate_aligned(size_t(ggml_matmul_bytes(n, cols, num_threads())));
  for (GgmlKernel kernel : kernels())
    for (bool threaded : {false, true}) {
      SCOPED_TRACE(testing::Message() << "kernel " << int(kernel) << (threaded ? " threaded" : " one thread"));
      std::vector<float> y = y0;
      if (threaded) ggml_matmul(x.data(), n, cols, parts, y.data(), out, beta, workspace.get(), kernel);
      else ggml_matmul_rows(x.data(), n, cols, parts, y.data(), out, beta, workspace.get(), kernel);
      for (int64_t j = 0; j < n; ++j)
        for (size_t p = 0; p < types.size(); ++p)
          for (int64_t r = 0; r < rows; ++r) {
            const float* w = decoded[p].data() + r * cols;
            double ref = beta * double(y0[size_t(j * out + int64_t(p) * rows + r)]), magnitude = std::fabs(ref);
            double exact = ref, rounding = 0;
            for (int64_t c = 0; c < cols; ++c) {
              const double xv = xr[size_t(j * cols + c)];
              ref += double(w[c]) * xv, magnitude += std::fabs(double(w[c]) * xv);
              exact += double(w[c]) * double(x[size_t(j * cols + c)]);
              rounding += std::fabs(double(w[c])) * std::fabs(xv - double(x[size_t(j * cols + c)]));
            }
            const double got = y[size_t(j * out + int64_t(p) * rows + r)];
            ASSERT_NEAR(got, ref, 2e-6 * magnitude + 1e-30)
                << ggml_type_name(uint32_t(types[p])) << " row " << j << " output " << r;
            ASSERT_NEAR(got, exact, rounding * (1 + 1e-5) + 2e-6 * magnitude + 1e-30);
          }
    }
}

TEST(GgmlGemm, EveryTypeAndKernelMatchesDoublePrecisionOnRoundedActivations) {
  uint64_t seed = 1;
  for (GgmlType t : quantised_types()) {
    SCOPED_TRACE(ggml_type_name(uint32_t(t)));
    check_product({t}, 5, 512, 3, 0.0f, seed++);  // decode-sized: the fused kernels where a type has one
    check_product({t}, 3, 768, 6, 0.0f, seed++);  // more rows: one unpacked chunk shared by the rows
    check_product({t}, 70, 256, 16, 0.5f, seed++);  // prefill: rows repacked for int8_gemm.h, 64 at a time
  }
}

TEST(GgmlGemm, FusedPartsOfDifferentTypesWithBetaAndManyRows) {
  // A Q4_K_M-like fused projection: parts of three types, each writing its own columns.
  check_product({GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ2_XXS}, 7, 256, 17, 0.5f, 11);
  check_product({GgmlType::Q8_0}, 3, 96, 1, 0.0f, 12);
  check_product({GgmlType::Q8_0}, 3, 64, 1, 0.0f, 12);
  check_product({GgmlType::Q8_0, GgmlType::IQ4_NL}, 3, 96, 2, 1.0f, 12);  // groups not a multiple of 16
}

TEST(GgmlGemm, RowsLongerThanOneUnpackedChunk) {
  check_product({GgmlType::Q2_K, GgmlType::IQ1_S}, 3, 2304, 2, 0.0f, 13);  // 2048 + 256 columns
  check_product({GgmlType::Q4_0}, 2, 2080, 1, 0.0f, 14);                  // 2048 + 32
}

}  // namespace
}  // namespace hyla
