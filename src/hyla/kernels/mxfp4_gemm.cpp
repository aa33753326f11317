#include "hyla/kernels/mxfp4_gemm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/core/team.h"

namespace hyla {
namespace {

constexpr int64_t kPanelRows = 16, kPairs = kMxfp4Block / 2, kPairBytes = 16;
constexpr int64_t kBlockBytes = kPairs * kPairBytes + kPanelRows;  // 272
// Register tile: up to 4 rows of x × 2 panels, each (row, panel) with a partial sum of the low
// and of the high nibbles' columns over the block and a running total: 24 vectors, so a single
// row still has 4 independent chains of fused multiply-adds.
constexpr int kTileRows = 4, kTilePanels = 2;

constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

int64_t panel_bytes(int64_t cols) { return cols / kMxfp4Block * kBlockBytes; }
int64_t panel_count(int64_t rows) { return ceil_div(rows, kPanelRows); }

// 2^(e − 127) as an f32 (e < 255): the exponent field for e ≥ 1, the subnormal 2^−127 for e = 0.
uint32_t scale_bits(uint32_t e) { return e == 0 ? 0x00400000u : e << 23; }
float scale_value(uint8_t e) { return std::bit_cast<float>(scale_bits(e)); }

// One register tile: rows [row0, row0 + rows) of x against `panels` consecutive panels.
struct Tile {
  const float* x;
  int64_t ld_x, row0, cols;
  const uint8_t* panels;
  int64_t panel_stride;
  float* y;  // output row row0, column of the first panel's first row
  int64_t ld_y;
  int64_t last_rows;  // rows of the last panel inside the matrix (1..16)
  float beta;
};

void store_lanes(const Tile& t, int m, int n, int panels, const float* acc) {
  float* out = t.y + m * t.ld_y + n * kPanelRows;
  const int64_t valid = n + 1 < panels ? kPanelRows : t.last_rows;
  for (int64_t i = 0; i < valid; ++i) out[i] = t.beta == 0.0f ? acc[i] : acc[i] + t.beta * out[i];
}

// The native kernels' arithmetic one lane at a time: per block, the low and the high nibbles'
// columns each summed by fused multiply-adds in column order, then total = fma(lo + hi, scale, total).
void tile_portable(const Tile& t, int rows, int panels) {
  const int64_t blocks = t.cols / kMxfp4Block;
  for (int m = 0; m < rows; ++m) {
    const float* x = t.x + (t.row0 + m) * t.ld_x;
    for (int n = 0; n < panels; ++n) {
      float total[kPanelRows] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* w = t.panels + n * t.panel_stride + b * kBlockBytes;
        const float* xb = x + b * kMxfp4Block;
        for (int i = 0; i < kPanelRows; ++i) {
          float lo = 0.0f, hi = 0.0f;
          for (int64_t j = 0; j < kPairs; ++j) {
            const uint8_t byte = w[j * kPairBytes + i];
            lo = std::fma(xb[2 * j], kValues[byte & 15], lo);
            hi = std::fma(xb[2 * j + 1], kValues[byte >> 4], hi);
          }
          total[i] = std::fma(lo + hi, scale_value(w[kPairs * kPairBytes + i]), total[i]);
        }
      }
      store_lanes(t, m, n, panels, total);
    }
  }
}

#if defined(__AVX512F__)
template <int R, int P>
void tile_avx512(const Tile& t) {
  const __m512 table = _mm512_loadu_ps(kValues);
  const int64_t blocks = t.cols / kMxfp4Block;
  __m512 total[R][P];
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < P; ++n) total[m][n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 lo[R][P], hi[R][P];
    for (int m = 0; m < R; ++m)
      for (int n = 0; n < P; ++n) lo[m][n] = hi[m][n] = _mm512_setzero_ps();
    const float* xb = t.x + t.row0 * t.ld_x + b * kMxfp4Block;
    for (int64_t j = 0; j < kPairs; ++j) {
      __m512 w_lo[P], w_hi[P];
      for (int n = 0; n < P; ++n) {
        const uint8_t* w = t.panels + n * t.panel_stride + b * kBlockBytes + j * kPairBytes;
        const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
        w_lo[n] = _mm512_permutexvar_ps(codes, table);  // vpermps reads the index's low 4 bits
        w_hi[n] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
      }
      for (int m = 0; m < R; ++m) {
        const __m512 x0 = _mm512_set1_ps(xb[m * t.ld_x + 2 * j]), x1 = _mm512_set1_ps(xb[m * t.ld_x + 2 * j + 1]);
        for (int n = 0; n < P; ++n) {
          lo[m][n] = _mm512_fmadd_ps(x0, w_lo[n], lo[m][n]);
          hi[m][n] = _mm512_fmadd_ps(x1, w_hi[n], hi[m][n]);
        }
      }
    }
    for (int n = 0; n < P; ++n) {
      const uint8_t* s = t.panels + n * t.panel_stride + b * kBlockBytes + kPairs * kPairBytes;
      const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      const __m512i bits = _mm512_mask_mov_epi32(_mm512_slli_epi32(e, 23), _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                                 _mm512_set1_epi32(0x00400000));
      const __m512 scale = _mm512_castsi512_ps(bits);
      for (int m = 0; m < R; ++m) total[m][n] = _mm512_fmadd_ps(_mm512_add_ps(lo[m][n], hi[m][n]), scale, total[m][n]);
    }
  }
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < P; ++n) {
      float acc[kPanelRows];
      _mm512_storeu_ps(acc, total[m][n]);
      store_lanes(t, m, n, P, acc);
    }
}

void tile_native(const Tile& t, int rows, int panels) {
  using Fn = void (*)(const Tile&);
  static constexpr Fn kTiles[kTileRows][kTilePanels] = {
      {tile_avx512<1, 1>, tile_avx512<1, 2>},
      {tile_avx512<2, 1>, tile_avx512<2, 2>},
      {tile_avx512<3, 1>, tile_avx512<3, 2>},
      {tile_avx512<4, 1>, tile_avx512<4, 2>},
  };
  kTiles[rows - 1][panels - 1](t);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define HYLA_MXFP4_AVX2 1
// Eight lanes: a panel is two halves of 8 rows. vpermps on 8 lanes reads 3 index bits, so the
// table holds the magnitudes and the code's bit 3 becomes the sign bit.
template <int R, int P>
void tile_avx2(const Tile& t) {
  const __m256 table = _mm256_loadu_ps(kMagnitudes);
  const __m256i sign = _mm256_set1_epi32(int32_t(0x80000000u));
  const int64_t blocks = t.cols / kMxfp4Block;
  constexpr int H = 2 * P;  // half panels
  __m256 total[R][H];
  for (int m = 0; m < R; ++m)
    for (int h = 0; h < H; ++h) total[m][h] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 lo[R][H], hi[R][H];
    for (int m = 0; m < R; ++m)
      for (int h = 0; h < H; ++h) lo[m][h] = hi[m][h] = _mm256_setzero_ps();
    const float* xb = t.x + t.row0 * t.ld_x + b * kMxfp4Block;
    for (int64_t j = 0; j < kPairs; ++j) {
      __m256 w_lo[H], w_hi[H];
      for (int h = 0; h < H; ++h) {
        const uint8_t* w = t.panels + (h / 2) * t.panel_stride + b * kBlockBytes + j * kPairBytes + (h % 2) * 8;
        const __m256i codes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
        const __m256i high = _mm256_srli_epi32(codes, 4);
        w_lo[h] = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, codes),
                                _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(codes, 28), sign)));
        w_hi[h] = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, high),
                                _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(high, 28), sign)));
      }
      for (int m = 0; m < R; ++m) {
        const __m256 x0 = _mm256_set1_ps(xb[m * t.ld_x + 2 * j]), x1 = _mm256_set1_ps(xb[m * t.ld_x + 2 * j + 1]);
        for (int h = 0; h < H; ++h) {
          lo[m][h] = _mm256_fmadd_ps(x0, w_lo[h], lo[m][h]);
          hi[m][h] = _mm256_fmadd_ps(x1, w_hi[h], hi[m][h]);
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      const uint8_t* s = t.panels + (h / 2) * t.panel_stride + b * kBlockBytes + kPairs * kPairBytes + (h % 2) * 8;
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
      const __m256i zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
      const __m256 scale = _mm256_castsi256_ps(
          _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000), zero));
      for (int m = 0; m < R; ++m) total[m][h] = _mm256_fmadd_ps(_mm256_add_ps(lo[m][h], hi[m][h]), scale, total[m][h]);
    }
  }
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < P; ++n) {
      float acc[kPanelRows];
      _mm256_storeu_ps(acc, total[m][2 * n]);
      _mm256_storeu_ps(acc + 8, total[m][2 * n + 1]);
      store_lanes(t, m, n, P, acc);
    }
}

void tile_avx2_dispatch(const Tile& t, int rows, int panels) {
  using Fn = void (*)(const Tile&);
  static constexpr Fn kTiles[kTileRows][kTilePanels] = {
      {tile_avx2<1, 1>, tile_avx2<1, 2>},
      {tile_avx2<2, 1>, tile_avx2<2, 2>},
      {tile_avx2<3, 1>, tile_avx2<3, 2>},
      {tile_avx2<4, 1>, tile_avx2<4, 2>},
  };
  kTiles[rows - 1][panels - 1](t);
}
#endif

Mxfp4Kernel resolve(Mxfp4Kernel kernel) {
  if (kernel != Mxfp4Kernel::Native) return kernel;
#if defined(__AVX512F__)
  return Mxfp4Kernel::Native;
#elif defined(HYLA_MXFP4_AVX2)
  return Mxfp4Kernel::Avx2;
#else
  return Mxfp4Kernel::Portable;
#endif
}

void run_tile(Mxfp4Kernel kernel, const Tile& t, int rows, int panels) {
  switch (kernel) {
#if defined(__AVX512F__)
    case Mxfp4Kernel::Native: tile_native(t, rows, panels); return;
#endif
#if defined(HYLA_MXFP4_AVX2)
    case Mxfp4Kernel::Avx2: tile_avx2_dispatch(t, rows, panels); return;
#endif
    default: tile_portable(t, rows, panels); return;
  }
}

}  // namespace

bool mxfp4_kernel_available(Mxfp4Kernel kernel) {
  switch (kernel) {
    case Mxfp4Kernel::Avx2:
#if defined(HYLA_MXFP4_AVX2)
      return true;
#else
      return false;
#endif
    default: return true;
  }
}

int64_t mxfp4_packed_bytes(int64_t rows, int64_t cols) {
  HYLA_ASSERT(cols % kMxfp4Block == 0);
  return panel_count(rows) * panel_bytes(cols);
}

void mxfp4_pack(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* dst) {
  HYLA_ASSERT(cols % kMxfp4Block == 0);
  const int64_t blocks = cols / kMxfp4Block, row_bytes = cols / 2;
  parallel_rows(panel_count(rows), kPanelRows * cols, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* out = dst + p * panel_bytes(cols) + b * kBlockBytes;
        for (int64_t i = 0; i < kPanelRows; ++i) {
          const int64_t r = p * kPanelRows + i;
          const uint8_t* in = codes + r * row_bytes + b * kPairs;
          for (int64_t j = 0; j < kPairs; ++j) out[j * kPairBytes + i] = r < rows ? in[j] : 0;
          out[kPairs * kPairBytes + i] = r < rows ? scales[r * blocks + b] : 0;
        }
      }
  });
}

float mxfp4_value(uint8_t code, uint8_t scale) { return kValues[code & 15] * scale_value(scale); }

int64_t mxfp4_first_nan_scale(const uint8_t* scales, int64_t n) {
  const uint8_t* hit = std::find(scales, scales + n, uint8_t(0xFF));
  return hit == scales + n ? -1 : hit - scales;
}

uint8_t mxfp4_quantize_block(const float* x, uint8_t* codes) {
  float max_abs = 0.0f;
  for (int64_t k = 0; k < kMxfp4Block; ++k) max_abs = std::max(max_abs, std::fabs(x[k]));
  // The largest magnitude maps into [4, 8): e − 127 = floor(log2 max) − 2, kept in [1, 254].
  const int exponent = max_abs > 0.0f ? std::ilogb(max_abs) - 2 : 0;
  const uint8_t e = uint8_t(std::clamp(exponent + 127, 1, 254));
  const float inverse = 1.0f / scale_value(e);  // a power of two: exact
  for (int64_t j = 0; j < kPairs; ++j) {
    uint8_t pair = 0;
    for (int half = 0; half < 2; ++half) {
      const float v = x[2 * j + half] * inverse, a = std::fabs(v);
      // Nearest magnitude, ties to the even index (its mantissa bit 0).
      int best = 0;
      for (int c = 1; c < 8; ++c) {
        const float d = std::fabs(a - kMagnitudes[c]), d_best = std::fabs(a - kMagnitudes[best]);
        if (d < d_best || (d == d_best && c % 2 == 0)) best = c;
      }
      const uint8_t code = uint8_t(best | (std::signbit(v) && best != 0 ? 8 : 0));
      pair |= uint8_t(code << (4 * half));
    }
    codes[j] = pair;
  }
  return e;
}

void mxfp4_matmul_rows(const float* x, int64_t n, int64_t ld_x, std::span<const Mxfp4PackedMatrix> parts, float* y,
                       int64_t ld_y, float beta, Mxfp4Kernel kernel) {
  kernel = resolve(kernel);
  HYLA_ASSERT(mxfp4_kernel_available(kernel));
  int64_t column = 0;
  for (const Mxfp4PackedMatrix& w : parts) {
    HYLA_ASSERT(w.cols % kMxfp4Block == 0);
    const int64_t panels = panel_count(w.rows), stride = panel_bytes(w.cols);
    for (int64_t p = 0; p < panels; p += kTilePanels) {
      const int np = int(std::min<int64_t>(kTilePanels, panels - p));
      const int64_t last_rows = std::min<int64_t>(kPanelRows, w.rows - (p + np - 1) * kPanelRows);
      for (int64_t r = 0; r < n; r += kTileRows) {
        const int nr = int(std::min<int64_t>(kTileRows, n - r));
        const Tile t{x, ld_x, r, w.cols, w.data + p * stride, stride, y + r * ld_y + column + p * kPanelRows, ld_y,
                     last_rows, beta};
        run_tile(kernel, t, nr, np);
      }
    }
    column += w.rows;
  }
}

}  // namespace hyla
