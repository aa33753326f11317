#include "hyla/kernels/ggml_gemm.h"

#include <algorithm>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/core/team.h"
#include "hyla/kernels/int8_gemm.h"

namespace hyla {
namespace {

constexpr int64_t kGroup = kGgmlGroup;
// Columns unpacked at a time: the buffer (2 KB of values, 256 B of scales and mins) stays in L1
// while every row of x is multiplied with it.
constexpr int64_t kChunkCols = 2048;
// Below this many multiply-adds a product runs on the calling thread (as int8_gemm.cpp's).
constexpr int64_t kParallelMacs = int64_t(1) << 16;

// A chunk of one unpacked weight row and the matching part of one rounded row of x.
struct Chunk {
  const int8_t* q;
  const float* scale;
  const float* min;  // null for types without offsets
  const int8_t* xq;
  const float* xs;      // s_x per group
  const int32_t* xsum;  // −128 · Σ q_x per group (int8_gemm.h's accumulator start)
  int64_t groups;
};

// Σ over the chunk's groups of s_x · (scale · Σ q·q_x − min · Σ q_x), as every kernel computes it
// but in its own order: min · Σ q_x = −min · xsum / 128.
float dot_portable(const Chunk& c) {
  float acc = 0, acc_min = 0;
  for (int64_t g = 0; g < c.groups; ++g) {
    int32_t sum = 0;
    for (int64_t i = g * kGroup; i < (g + 1) * kGroup; ++i) sum += int32_t(c.q[i]) * int32_t(c.xq[i]);
    acc += c.scale[g] * c.xs[g] * float(sum);
    if (c.min) acc_min += c.min[g] * c.xs[g] * float(c.xsum[g]);
  }
  return acc + acc_min * (1.0f / 128.0f);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

// Lane l of a vpdpbusd result over 64 values holds values 4l … 4l + 3: group l / 4 of the 4.
float dot_native(const Chunk& c) {
  const __m512i group_of_lane[4] = {
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4),
      _mm512_set_epi32(11, 11, 11, 11, 10, 10, 10, 10, 9, 9, 9, 9, 8, 8, 8, 8),
      _mm512_set_epi32(15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12)};
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc = _mm512_setzero_ps(), acc_min = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < c.groups; g0 += 16) {
    const int64_t groups = std::min<int64_t>(16, c.groups - g0);
    const __mmask16 valid = __mmask16((1u << groups) - 1);
    const __m512 xs = _mm512_maskz_loadu_ps(valid, c.xs + g0);
    const __m512 scale = _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, c.scale + g0), xs);
    if (c.min) {
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(valid, c.xsum + g0));
      acc_min = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(valid, c.min + g0), xs), sum, acc_min);
    }
    const int8_t* q = c.q + g0 * kGroup;
    const int8_t* xq = c.xq + g0 * kGroup;
    for (int k = 0; k < (groups + 3) / 4; ++k) {
      const int64_t bytes = std::min<int64_t>(64, (groups - 4 * k) * kGroup);
      const __mmask64 load = bytes == 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
      const __m512i w = _mm512_maskz_loadu_epi8(load, q + 64 * k);
      const __m512i x = _mm512_maskz_loadu_epi8(load, xq + 64 * k);
      // |w| · (x with w's sign): vpdpbusd multiplies unsigned by signed bytes (|−128| reads as 128).
      const __m512i x_signed = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), zero, x);
      const __m512i sums = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(w), x_signed);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_permutexvar_ps(group_of_lane[k], scale), acc);
    }
  }
  return _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(acc_min) * (1.0f / 128.0f);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool kHaveAvx2 = true;

float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// Lane l of a vpmaddubsw + vpmaddwd result over 32 values holds values 4l … 4l + 3: group l / 4 of
// the 2. Groups come in pairs: a chunk's group count is even (32-value blocks at least).
float dot_avx2(const Chunk& c) {
  const __m256i lane_group[4] = {_mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0), _mm256_set_epi32(3, 3, 3, 3, 2, 2, 2, 2),
                                 _mm256_set_epi32(5, 5, 5, 5, 4, 4, 4, 4), _mm256_set_epi32(7, 7, 7, 7, 6, 6, 6, 6)};
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  alignas(32) float tail_xs[8], tail_scale[8], tail_min[8];
  alignas(32) int32_t tail_sum[8];
  for (int64_t g0 = 0; g0 < c.groups; g0 += 8) {
    const int64_t groups = std::min<int64_t>(8, c.groups - g0);
    const float *xs_p = c.xs + g0, *scale_p = c.scale + g0, *min_p = c.min ? c.min + g0 : nullptr;
    const int32_t* sum_p = c.xsum + g0;
    if (groups < 8) {  // zero-padded copies of the last groups
      std::fill_n(tail_xs, 8, 0.0f), std::fill_n(tail_scale, 8, 0.0f), std::fill_n(tail_min, 8, 0.0f);
      std::fill_n(tail_sum, 8, 0);
      std::copy_n(xs_p, groups, tail_xs), std::copy_n(scale_p, groups, tail_scale), std::copy_n(sum_p, groups, tail_sum);
      if (min_p) std::copy_n(min_p, groups, tail_min), min_p = tail_min;
      xs_p = tail_xs, scale_p = tail_scale, sum_p = tail_sum;
    }
    const __m256 xs = _mm256_loadu_ps(xs_p);
    const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(scale_p), xs);
    if (min_p) {
      const __m256 sum = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum_p)));
      acc_min = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(min_p), xs), sum, acc_min);
    }
    for (int k = 0; k < groups / 2; ++k) {
      const int64_t at = (g0 + 2 * k) * kGroup;
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.q + at));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xq + at));
      // |w| ≤ 128 and |q_x| ≤ 127: a pair's sum stays within int16.
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
      const __m256i sums = _mm256_madd_epi16(pairs, ones);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_permutevar8x32_ps(scale, lane_group[k]), acc);
    }
  }
  return hsum(acc) + hsum(acc_min) * (1.0f / 128.0f);
}
#else
constexpr bool kHaveAvx2 = false;
#endif

using DotFn = float (*)(const Chunk&);

DotFn dot_for(GgmlKernel kernel) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (kernel == GgmlKernel::Native) return dot_native;
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (kernel == GgmlKernel::Avx2 || kernel == GgmlKernel::Native) return dot_avx2;
#endif
  (void)kernel;
  return dot_portable;
}

// Output rows [first, last) of the stacked parts against every row of x.
void run_rows(const Int8Rows& x, std::span<const GgmlMatrix> parts, int64_t first, int64_t last, float* y,
              int64_t ld_y, float beta, DotFn dot) {
  alignas(64) int8_t q[kChunkCols];
  alignas(64) float scale[kChunkCols / kGroup], min[kChunkCols / kGroup];
  const int64_t cols = x.cols, groups_per_row = cols / kGroup;
  int64_t part_first = 0;
  for (const GgmlMatrix& w : parts) {
    const int64_t lo = std::max(first, part_first), hi = std::min(last, part_first + w.rows);
    const bool has_min = ggml_type_has_min(w.type);
    const int64_t block = ggml_block_values(w.type), chunk_cols = kChunkCols / block * block;
    for (int64_t r = lo; r < hi; ++r) {
      const uint8_t* row = w.data + uint64_t(r - part_first) * w.row_bytes();
      for (int64_t c0 = 0; c0 < cols; c0 += chunk_cols) {
        const int64_t n_cols = std::min(chunk_cols, cols - c0);
        ggml_unpack(w.type, row + ggml_bytes(w.type, c0), n_cols, q, scale, min);
        for (int64_t j = 0; j < x.rows; ++j) {
          const int64_t g0 = j * groups_per_row + c0 / kGroup;
          const Chunk c{q, scale, has_min ? min : nullptr, x.values + j * cols + c0, x.scales + g0, x.starts + g0,
                        n_cols / kGroup};
          float& out = y[j * ld_y + r];
          const float sum = dot(c);
          out = c0 > 0 ? out + sum : beta == 0.0f ? sum : sum + beta * out;
        }
      }
    }
    part_first += w.rows;
  }
}

int64_t total_rows(std::span<const GgmlMatrix> parts, int64_t cols) {
  int64_t rows = 0;
  for (const GgmlMatrix& w : parts) {
    HYLA_ASSERT(w.cols == cols && ggml_type_quantized(w.type) && cols % ggml_block_values(w.type) == 0);
    rows += w.rows;
  }
  return rows;
}

Int8Kernel quantisation_kernel(GgmlKernel kernel) {
  return kernel == GgmlKernel::Portable ? Int8Kernel::Portable : Int8Kernel::Native;
}

}  // namespace

bool ggml_kernel_available(GgmlKernel kernel) {
  switch (kernel) {
    case GgmlKernel::Native: return true;
    case GgmlKernel::Avx2: return kHaveAvx2;
    case GgmlKernel::Portable: return true;
  }
  return false;
}

int64_t ggml_matmul_bytes(int64_t n, int64_t cols) { return int8_rows_bytes(n, cols, kGroup); }

void ggml_matmul_rows(const float* x, int64_t n, int64_t ld_x, std::span<const GgmlMatrix> parts, float* y,
                      int64_t ld_y, float beta, void* workspace, GgmlKernel kernel) {
  HYLA_ASSERT(!parts.empty());
  const int64_t cols = parts[0].cols, rows = total_rows(parts, cols);
  const Int8Rows xq = int8_rows_view(workspace, n, cols, kGroup);
  quantize_int8_rows(x, ld_x, xq, 0, n, quantisation_kernel(kernel));
  run_rows(xq, parts, 0, rows, y, ld_y, beta, dot_for(kernel));
}

void ggml_matmul(const float* x, int64_t n, int64_t ld_x, std::span<const GgmlMatrix> parts, float* y, int64_t ld_y,
                 float beta, void* workspace, GgmlKernel kernel) {
  HYLA_ASSERT(!parts.empty());
  const int64_t cols = parts[0].cols, rows = total_rows(parts, cols);
  const Int8Rows xq = int8_rows_view(workspace, n, cols, kGroup);
  const bool parallel = n * rows * cols >= kParallelMacs && rows > 1;
  if (parallel && n > 1)
    parallel_for(n, 1, [&](int, int64_t first, int64_t last) {
      quantize_int8_rows(x, ld_x, xq, first, last, quantisation_kernel(kernel));
    });
  else
    quantize_int8_rows(x, ld_x, xq, 0, n, quantisation_kernel(kernel));
  const DotFn dot = dot_for(kernel);
  const int64_t grain = parallel ? std::max<int64_t>(1, rows / (4 * num_threads())) : rows;
  parallel_for(rows, grain, [&](int, int64_t first, int64_t last) { run_rows(xq, parts, first, last, y, ld_y, beta, dot); });
}

}  // namespace hyla
