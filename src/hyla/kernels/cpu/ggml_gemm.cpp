#include "hyla/kernels/ggml_gemm.h"

#include <algorithm>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/core/team.h"
#include "hyla/kernels/cpu/ggml_fused.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/small_gemm.h"

namespace hyla {
namespace {

constexpr int64_t kGroup = kGgmlGroup;
// Columns unpacked at a time: the buffer (2 KB of values, 256 B of scales and mins) stays in L1
// while every row of x is multiplied with it.
constexpr int64_t kChunkCols = 2048;
// Below this many multiply-adds a product runs on the calling thread (as int8_gemm.cpp's).
constexpr int64_t kParallelMacs = int64_t(1) << 16;
// Up to this many rows of x a fused kernel decodes each weight block once per row; more rows
// share one unpacked chunk.
constexpr int64_t kFusedRows = 4;
// From this many rows of x on (prefill), kRepackRows rows of W at a time are unpacked and packed
// as int8_gemm.h's int8 with blocks of 16 (the unpacked values and scales as they are) in the
// workspace, and multiplied by its kernels, whose tiles keep 16 rows of W in a vector's lanes; the
// offsets (−min · Σ q_x per group) are added apart. A transient copy of a few rows, not of the matrix.
constexpr int64_t kRepackMinRows = 16, kRepackRows = 64;

// A thread's repacking space: the unpacked rows, their scales, mins and mins transposed, and the
// packed rows.
int64_t repack_bytes(int64_t cols) {
  const int64_t groups = cols / kGgmlGroup;
  return round_up(kRepackRows * cols, 64) + 3 * round_up(kRepackRows * groups * 4, 64) +
         round_up(int8_packed_bytes(kRepackRows, cols, kGgmlGroup), 64);
}

// x rounded per `block` values (256 where every part has 256-value blocks, as ggml's Q8_K; else
// 32, as its Q8_0), with each group of 16 values' scale (its block's) and Σ q_x.
struct XRows {
  Int8Rows rounded;
  float* scale16;
  int32_t* sum16;
  uint8_t* biased;       // q_x + 128, the unsigned operand of the AVX-512 panels
  float* scaled_sum16;   // s_x · Σ q_x per group
  int32_t* start16;      // −128 · Σ q_x per group (int8_gemm.h's accumulator start)
  // The rows as int8_gemm.h's products take them: blocks of 16 values (each with its block's scale).
  Int8Rows as_int8() const { return {rounded.values, scale16, start16, rounded.rows, rounded.cols, kGroup}; }
  int64_t rows() const { return rounded.rows; }
  int64_t cols() const { return rounded.cols; }
  int64_t block() const { return rounded.block; }
};

int64_t groups_bytes(int64_t n, int64_t cols) { return round_up(n * (cols / kGroup) * 4, 64); }

// The bytes of xrows_view's layout (widths rounded to whole 32-value blocks: sizes only).
int64_t xrows_bytes(int64_t n, int64_t cols) {
  cols = round_up(cols, 32);
  return int8_rows_bytes(n, cols, 32) + 4 * groups_bytes(n, cols) + round_up(n * cols, 64);
}

XRows xrows_view(void* workspace, int64_t n, int64_t cols, int64_t block) {
  auto* p = static_cast<uint8_t*>(workspace);
  const int64_t rounded = int8_rows_bytes(n, cols, 32);  // the larger of blocks 32 and 256
  const int64_t groups = groups_bytes(n, cols);
  uint8_t* rest = p + rounded + 2 * groups + round_up(n * cols, 64);
  return {int8_rows_view(p, n, cols, block), reinterpret_cast<float*>(p + rounded),
          reinterpret_cast<int32_t*>(p + rounded + groups), p + rounded + 2 * groups, reinterpret_cast<float*>(rest),
          reinterpret_cast<int32_t*>(rest + groups)};
}

void round_rows(const float* x, int64_t ld_x, const XRows& out, int64_t first, int64_t last, Int8Kernel kernel) {
  const Int8Rows& r = out.rounded;
  quantize_int8_rows(x, ld_x, r, first, last, kernel);
  const int64_t groups = r.cols / kGroup;
  for (int64_t j = first; j < last; ++j)
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      for (int64_t i = 0; i < kGroup; ++i) sum += r.values[j * r.cols + g * kGroup + i];
      out.sum16[j * groups + g] = sum;
      out.scale16[j * groups + g] = r.scales[j * (r.cols / r.block) + g * kGroup / r.block];
      out.scaled_sum16[j * groups + g] = out.scale16[j * groups + g] * float(sum);
      out.start16[j * groups + g] = -128 * sum;
    }
  for (int64_t i = first * r.cols; i < last * r.cols; ++i) out.biased[i] = uint8_t(r.values[i] + 128);
}

// A chunk of one unpacked weight row and the matching part of one rounded row of x.
struct Chunk {
  const int8_t* q;
  const float* scale;
  const float* min;  // null for types without offsets
  const int8_t* xq;
  const float* xs;      // s_x per group
  const int32_t* xsum;  // Σ q_x per group
  int64_t groups;
};

// Σ over the chunk's groups of s_x · (scale · Σ q·q_x − min · Σ q_x), as every kernel computes it
// but in its own order.
float dot_portable(const Chunk& c) {
  float acc = 0, acc_min = 0;
  for (int64_t g = 0; g < c.groups; ++g) {
    int32_t sum = 0;
    for (int64_t i = g * kGroup; i < (g + 1) * kGroup; ++i) sum += int32_t(c.q[i]) * int32_t(c.xq[i]);
    acc += c.scale[g] * c.xs[g] * float(sum);
    if (c.min) acc_min += c.min[g] * c.xs[g] * float(c.xsum[g]);
  }
  return acc - acc_min;
}

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
  return hsum(acc) - hsum(acc_min);
}
#else
constexpr bool kHaveAvx2 = false;
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// Rows of W unpacked kPanelRows at a time and multiplied with rows of x kTileRows at a time:
// vpdpbusd on q_x + 128 (unsigned, shared by the panel's rows) and q (signed), so a group adds
// s_x · (scale · (Σ q·(q_x + 128) − 128 · Σ q) − min · Σ q_x).
constexpr int kPanelRows = 4, kTileRows = 4;

struct Panel {
  alignas(64) int8_t q[kPanelRows][kChunkCols];
  alignas(64) float scale[kPanelRows][kChunkCols / kGroup];
  alignas(64) float offset[kPanelRows][kChunkCols / kGroup];  // 128 · Σ q · scale per group
  alignas(64) float min[kPanelRows][kChunkCols / kGroup];
};

// Unpacks `rows` rows' columns [c0, c0 + n_cols) into the panel, zero-padded to whole 64 columns.
void unpack_panel(const GgmlMatrix& w, const uint8_t* first_row, int rows, int64_t c0, int64_t n_cols, Panel& p) {
  const int64_t groups = n_cols / kGroup, padded = round_up(groups, 4);
  const bool has_min = ggml_type_has_min(w.type);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = first_row + uint64_t(r) * w.row_bytes() + ggml_bytes(w.type, c0);
    ggml_unpack(w.type, row, n_cols, p.q[r], p.scale[r], p.min[r]);
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      for (int64_t i = 0; i < kGroup; ++i) sum += p.q[r][g * kGroup + i];
      p.offset[r][g] = 128.0f * float(sum) * p.scale[r][g];
      if (!has_min) p.min[r][g] = 0.0f;
    }
    for (int64_t g = groups; g < padded; ++g) {
      std::fill_n(p.q[r] + g * kGroup, kGroup, int8_t(0));
      p.scale[r][g] = p.offset[r][g] = p.min[r][g] = 0.0f;
    }
  }
}

// y[j, r] (+)= the panel's rows against rows [j0, j0 + rows_x) of x, for the chunk's columns.
template <int R, int J>
void panel_tile(const Panel& p, const XRows& x, int64_t j0, int64_t c0, int64_t n_cols, float* y, int64_t ld_y,
                int64_t r0, bool first_chunk, float beta) {
  const __m512i group_of_lane = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const int64_t cols = x.cols(), groups = cols / kGroup, chunk_groups = n_cols / kGroup;
  __m512 acc[J][R];
  for (int j = 0; j < J; ++j)
    for (int r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < chunk_groups; g += 4) {
    const int64_t valid_groups = std::min<int64_t>(4, chunk_groups - g);
    const __mmask64 bytes = valid_groups == 4 ? ~__mmask64(0) : (__mmask64(1) << (valid_groups * kGroup)) - 1;
    const __mmask16 group_mask = __mmask16((1u << valid_groups) - 1);
    __m512i xv[J];
    __m512 xs[J];
    for (int j = 0; j < J; ++j) {
      const int64_t row = j0 + j;
      xv[j] = _mm512_maskz_loadu_epi8(bytes, x.biased + row * cols + c0 + g * kGroup);
      xs[j] = _mm512_permutexvar_ps(group_of_lane,
                                    _mm512_maskz_loadu_ps(group_mask, x.scale16 + row * groups + c0 / kGroup + g));
    }
    for (int r = 0; r < R; ++r) {
      const __m512i wv = _mm512_load_si512(p.q[r] + g * kGroup);
      const __m512 ws = _mm512_permutexvar_ps(group_of_lane, _mm512_load_ps(p.scale[r] + g));
      for (int j = 0; j < J; ++j) {
        const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), xv[j], wv);
        acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, xs[j]), acc[j][r]);
      }
    }
  }
  for (int64_t g = 0; g < chunk_groups; g += 16) {
    const __mmask16 m = __mmask16(chunk_groups - g >= 16 ? 0xffff : (1u << (chunk_groups - g)) - 1);
    for (int j = 0; j < J; ++j) {
      const int64_t at = (j0 + j) * groups + c0 / kGroup + g;
      const __m512 xs = _mm512_maskz_loadu_ps(m, x.scale16 + at), xsum = _mm512_maskz_loadu_ps(m, x.scaled_sum16 + at);
      for (int r = 0; r < R; ++r) {
        acc[j][r] = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(m, p.offset[r] + g), xs, acc[j][r]);
        acc[j][r] = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(m, p.min[r] + g), xsum, acc[j][r]);
      }
    }
  }
  for (int j = 0; j < J; ++j)
    for (int r = 0; r < R; ++r) {
      float& out = y[(j0 + j) * ld_y + r0 + r];
      const float sum = _mm512_reduce_add_ps(acc[j][r]);
      out = !first_chunk ? out + sum : beta == 0.0f ? sum : sum + beta * out;
    }
}

template <int R>
void panel_rows(const Panel& p, const XRows& x, int64_t c0, int64_t n_cols, float* y, int64_t ld_y, int64_t r0,
                bool first_chunk, float beta) {
  int64_t j = 0;
  for (; j + kTileRows <= x.rows(); j += kTileRows) panel_tile<R, kTileRows>(p, x, j, c0, n_cols, y, ld_y, r0, first_chunk, beta);
  switch (x.rows() - j) {
    case 3: panel_tile<R, 3>(p, x, j, c0, n_cols, y, ld_y, r0, first_chunk, beta); break;
    case 2: panel_tile<R, 2>(p, x, j, c0, n_cols, y, ld_y, r0, first_chunk, beta); break;
    case 1: panel_tile<R, 1>(p, x, j, c0, n_cols, y, ld_y, r0, first_chunk, beta); break;
    default: break;
  }
}

// Output rows [lo, hi) of the stacked parts, in one part (whose rows start at part_row0), every row of x.
void run_panels(const XRows& x, const GgmlMatrix& w, int64_t part_row0, int64_t lo, int64_t hi, float* y, int64_t ld_y,
                float beta) {
  Panel p;
  const int64_t cols = x.cols(), block = ggml_block_values(w.type), chunk_cols = kChunkCols / block * block;
  for (int64_t r = lo; r < hi; r += kPanelRows) {
    const int rows = int(std::min<int64_t>(kPanelRows, hi - r));
    const uint8_t* first_row = w.data + uint64_t(r - part_row0) * w.row_bytes();
    for (int64_t c0 = 0; c0 < cols; c0 += chunk_cols) {
      const int64_t n_cols = std::min(chunk_cols, cols - c0);
      unpack_panel(w, first_row, rows, c0, n_cols, p);
      switch (rows) {
        case 4: panel_rows<4>(p, x, c0, n_cols, y, ld_y, r, c0 == 0, beta); break;
        case 3: panel_rows<3>(p, x, c0, n_cols, y, ld_y, r, c0 == 0, beta); break;
        case 2: panel_rows<2>(p, x, c0, n_cols, y, ld_y, r, c0 == 0, beta); break;
        default: panel_rows<1>(p, x, c0, n_cols, y, ld_y, r, c0 == 0, beta); break;
      }
    }
  }
}
#endif

using DotFn = float (*)(const Chunk&);

// The unpacked chunks' dot product where the AVX-512 panels do not run.
DotFn dot_for(GgmlKernel kernel) {
#if defined(__AVX2__) && defined(__FMA__)
  if (kernel == GgmlKernel::Avx2 || kernel == GgmlKernel::Native) return dot_avx2;
#endif
  (void)kernel;
  return dot_portable;
}

// Rows [lo, hi) of one part (the stacked parts' rows from part_first on) through int8_gemm.h,
// kRepackRows at a time, in `scratch` (repack_bytes).
void run_repacked(const XRows& x, const GgmlMatrix& w, int64_t part_first, int64_t lo, int64_t hi, float* y,
                  int64_t ld_y, float beta, uint8_t* scratch) {
  const int64_t cols = x.cols(), groups = cols / kGroup;
  auto* q = reinterpret_cast<int8_t*>(scratch);
  auto* scale = reinterpret_cast<float*>(scratch + round_up(kRepackRows * cols, 64));
  float* min = scale + round_up(kRepackRows * groups * 4, 64) / 4;
  float* min_t = min + round_up(kRepackRows * groups * 4, 64) / 4;
  uint8_t* packed = reinterpret_cast<uint8_t*>(min_t) + round_up(kRepackRows * groups * 4, 64);
  const bool has_min = ggml_type_has_min(w.type);
  const Int8Rows xi = x.as_int8();
  for (int64_t r = lo; r < hi; r += kRepackRows) {
    const int64_t rows = std::min(kRepackRows, hi - r);
    ggml_unpack(w.type, w.data + uint64_t(r - part_first) * w.row_bytes(), rows * cols, q, scale, min);
    int8_pack(q, scale, rows, cols, kGroup, packed);
    const Int8PackedMatrix m{packed, rows, cols, kGroup};
    int8_matmul_rows(xi, {&m, 1}, y + r, ld_y, beta);
    if (!has_min) continue;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t g = 0; g < groups; ++g) min_t[g * rows + i] = min[i * groups + g];
    small_gemm(false, x.rows(), rows, groups, -1.0f, x.scaled_sum16, groups, min_t, rows, 1.0f, y + r, ld_y);
  }
}

// Output rows [first, last) of the stacked parts against every row of x. `scratch`: this thread's
// repack_bytes where x has kRepackMinRows rows or more.
void run_rows(const XRows& x, std::span<const GgmlMatrix> parts, int64_t first, int64_t last, float* y, int64_t ld_y,
              float beta, GgmlKernel kernel, uint8_t* scratch) {
  alignas(64) int8_t q[kChunkCols];
  alignas(64) float scale[kChunkCols / kGroup], min[kChunkCols / kGroup];
  const DotFn dot = dot_for(kernel);
  const int64_t cols = x.cols(), groups = cols / kGroup;
  const auto store = [&](float& out, float sum, bool first_chunk) {
    out = !first_chunk ? out + sum : beta == 0.0f ? sum : sum + beta * out;
  };
  int64_t part_first = 0;
  for (const GgmlMatrix& w : parts) {
    const int64_t lo = std::max(first, part_first), hi = std::min(last, part_first + w.rows);
    const bool has_min = ggml_type_has_min(w.type);
    const int64_t block = ggml_block_values(w.type), chunk_cols = kChunkCols / block * block;
    const ggml_fused::DotFn fused =
        kernel == GgmlKernel::Native && x.block() == block && x.rows() <= kFusedRows ? ggml_fused::dot_for(w.type) : nullptr;
    if (kernel == GgmlKernel::Native && x.rows() >= kRepackMinRows) {
      if (lo < hi) run_repacked(x, w, part_first, lo, hi, y, ld_y, beta, scratch);
      part_first += w.rows;
      continue;
    }
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if (kernel == GgmlKernel::Native && !fused) {
      if (lo < hi) run_panels(x, w, part_first, lo, hi, y, ld_y, beta);
      part_first += w.rows;
      continue;
    }
#endif
    const uint64_t row_bytes = w.row_bytes();
    for (int64_t r = lo; r < hi; ++r) {
      const uint8_t* row = w.data + uint64_t(r - part_first) * row_bytes;
      if (fused) {
        for (int64_t j = 0; j < x.rows(); ++j)
          store(y[j * ld_y + r], fused(row, x.rounded.values + j * cols, x.scale16 + j * groups, x.sum16 + j * groups, cols / block),
                true);
        continue;
      }
      for (int64_t c0 = 0; c0 < cols; c0 += chunk_cols) {
        const int64_t n_cols = std::min(chunk_cols, cols - c0);
        ggml_unpack(w.type, row + ggml_bytes(w.type, c0), n_cols, q, scale, min);
        for (int64_t j = 0; j < x.rows(); ++j) {
          const int64_t g0 = j * groups + c0 / kGroup;
          const Chunk c{q, scale, has_min ? min : nullptr, x.rounded.values + j * cols + c0, x.scale16 + g0, x.sum16 + g0,
                        n_cols / kGroup};
          store(y[j * ld_y + r], dot(c), c0 == 0);
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

// 256 where every part's blocks are 256 values, else 32.
int64_t x_block(std::span<const GgmlMatrix> parts) {
  for (const GgmlMatrix& w : parts)
    if (ggml_block_values(w.type) != 256) return 32;
  return 256;
}

Int8Kernel quantisation_kernel(GgmlKernel kernel) {
  return kernel == GgmlKernel::Portable ? Int8Kernel::Portable : Int8Kernel::Native;
}

// Thread t's repacking space in a workspace of ggml_matmul_bytes (null for fewer rows).
uint8_t* repack_space(void* workspace, int64_t n, int64_t cols, int thread) {
  if (n < kRepackMinRows) return nullptr;
  return static_cast<uint8_t*>(workspace) + xrows_bytes(n, cols) + thread * repack_bytes(round_up(cols, 32));
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

int64_t ggml_matmul_bytes(int64_t n, int64_t cols, int threads) {
  // Sizes only: a caller may size for widths no block matrix has.
  const int64_t x = xrows_bytes(n, cols);
  return n < kRepackMinRows ? x : x + threads * repack_bytes(round_up(cols, 32));
}

void ggml_matmul_rows(const float* x, int64_t n, int64_t ld_x, std::span<const GgmlMatrix> parts, float* y,
                      int64_t ld_y, float beta, void* workspace, GgmlKernel kernel) {
  HYLA_ASSERT(!parts.empty());
  const int64_t cols = parts[0].cols, rows = total_rows(parts, cols);
  const XRows xq = xrows_view(workspace, n, cols, x_block(parts));
  round_rows(x, ld_x, xq, 0, n, quantisation_kernel(kernel));
  run_rows(xq, parts, 0, rows, y, ld_y, beta, kernel, repack_space(workspace, n, cols, 0));
}

void ggml_matmul(const float* x, int64_t n, int64_t ld_x, std::span<const GgmlMatrix> parts, float* y, int64_t ld_y,
                 float beta, void* workspace, GgmlKernel kernel) {
  HYLA_ASSERT(!parts.empty());
  const int64_t cols = parts[0].cols, rows = total_rows(parts, cols), block = x_block(parts);
  const bool parallel = n * rows * cols >= kParallelMacs && rows > 1;
  const XRows xq = xrows_view(workspace, n, cols, block);
  if (parallel && n > 1)
    parallel_for(n, 1, [&](int, int64_t first, int64_t last) { round_rows(x, ld_x, xq, first, last, quantisation_kernel(kernel)); });
  else
    round_rows(x, ld_x, xq, 0, n, quantisation_kernel(kernel));
  const int64_t grain = parallel ? std::max<int64_t>(1, rows / (4 * num_threads())) : rows;
  parallel_for(rows, grain, [&](int thread, int64_t first, int64_t last) {
    run_rows(xq, parts, first, last, y, ld_y, beta, kernel, repack_space(workspace, n, cols, thread));
  });
}

}  // namespace hyla
