#include "hyla/kernels/mxfp4_gemm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/core/team.h"
#include "hyla/kernels/int8_gemm.h"

namespace hyla {
namespace {

constexpr int64_t kPanelRows = 16, kGroups = 4, kGroupBytes = 64, kGroupColumns = 8;
constexpr int64_t kBlockBytes = kGroups * kGroupBytes + kPanelRows;  // 272
constexpr int kPartials = 4;  // partial sums per lane and block (column k into k mod 4)
// Register tiles: R rows of x × P panels with R·P ≤ 4, each (row, panel) with 4 partial sums and
// a running total: ≤ 20 vectors. A single row runs 2 panels (8 independent chains of fused
// multiply-adds); 3 or 4 rows run one panel each.
constexpr int kTileRows = 4;

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

// Row m, panel n of a tile's outputs (Tile or Q8Tile): y = acc + beta·y for the panel's rows inside
// the matrix.
template <class AnyTile>
void store_lanes(const AnyTile& t, int m, int n, int panels, const float* acc) {
  float* out = t.y + m * t.ld_y + n * kPanelRows;
  const int64_t valid = n + 1 < panels ? kPanelRows : t.last_rows;
  for (int64_t i = 0; i < valid; ++i) out[i] = t.beta == 0.0f ? acc[i] : acc[i] + t.beta * out[i];
}

// The native kernels' arithmetic one lane at a time (the order the header states).
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
          float partial[kPartials] = {};
          for (int64_t k = 0; k < kMxfp4Block; ++k) {
            uint32_t word;
            std::memcpy(&word, w + (k / kGroupColumns) * kGroupBytes + 4 * i, 4);
            const float value = kValues[(word >> (4 * (k % kGroupColumns))) & 15];
            partial[k % kPartials] = std::fma(xb[k], value, partial[k % kPartials]);
          }
          const float sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
          total[i] = std::fma(sum, scale_value(w[kGroups * kGroupBytes + i]), total[i]);
        }
      }
      store_lanes(t, m, n, panels, total);
    }
  }
}

#if defined(__AVX512F__)
// scale_value of a panel's 16 scale bytes.
__m512 scale_values(const uint8_t* s) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(
      _mm512_slli_epi32(e, 23), _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()), _mm512_set1_epi32(0x00400000)));
}

template <int R, int P>
void tile_avx512(const Tile& t) {
  const __m512 table = _mm512_loadu_ps(kValues);
  const int64_t blocks = t.cols / kMxfp4Block;
  __m512 total[R][P];
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < P; ++n) total[m][n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 partial[R][P][kPartials];
    for (int m = 0; m < R; ++m)
      for (int n = 0; n < P; ++n)
        for (int a = 0; a < kPartials; ++a) partial[m][n][a] = _mm512_setzero_ps();
    const float* xb = t.x + t.row0 * t.ld_x + b * kMxfp4Block;
#pragma GCC unroll 4
    for (int64_t g = 0; g < kGroups; ++g) {
      __m512i words[P];
      for (int n = 0; n < P; ++n)
        words[n] = _mm512_loadu_si512(t.panels + n * t.panel_stride + b * kBlockBytes + g * kGroupBytes);
#pragma GCC unroll 8
      for (int c = 0; c < kGroupColumns; ++c) {
        const int64_t k = g * kGroupColumns + c;
        for (int n = 0; n < P; ++n) {
          const __m512 w = _mm512_permutexvar_ps(_mm512_srli_epi32(words[n], unsigned(4 * c)), table);
          for (int m = 0; m < R; ++m)
            partial[m][n][c % kPartials] = _mm512_fmadd_ps(_mm512_set1_ps(xb[m * t.ld_x + k]), w, partial[m][n][c % kPartials]);
        }
      }
    }
    for (int n = 0; n < P; ++n) {
      const __m512 scale = scale_values(t.panels + n * t.panel_stride + b * kBlockBytes + kGroups * kGroupBytes);
      for (int m = 0; m < R; ++m) {
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(partial[m][n][0], partial[m][n][1]),
                                         _mm512_add_ps(partial[m][n][2], partial[m][n][3]));
        total[m][n] = _mm512_fmadd_ps(sum, scale, total[m][n]);
      }
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
  if (panels == 2) return rows == 1 ? tile_avx512<1, 2>(t) : tile_avx512<2, 2>(t);
  switch (rows) {
    case 1: return tile_avx512<1, 1>(t);
    case 2: return tile_avx512<2, 1>(t);
    case 3: return tile_avx512<3, 1>(t);
    default: return tile_avx512<4, 1>(t);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define HYLA_MXFP4_AVX2 1
// Eight lanes: a panel is two halves of 8 rows (each half's words are 32 consecutive bytes).
// vpermps on 8 lanes reads 3 index bits, so the table holds the magnitudes and the code's bit 3
// becomes the sign bit.
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
    __m256 partial[R][H][kPartials];
    for (int m = 0; m < R; ++m)
      for (int h = 0; h < H; ++h)
        for (int a = 0; a < kPartials; ++a) partial[m][h][a] = _mm256_setzero_ps();
    const float* xb = t.x + t.row0 * t.ld_x + b * kMxfp4Block;
#pragma GCC unroll 4
    for (int64_t g = 0; g < kGroups; ++g) {
      __m256i words[H];
      for (int h = 0; h < H; ++h)
        words[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
            t.panels + (h / 2) * t.panel_stride + b * kBlockBytes + g * kGroupBytes + (h % 2) * 32));
#pragma GCC unroll 8
      for (int c = 0; c < kGroupColumns; ++c) {
        const int64_t k = g * kGroupColumns + c;
        for (int h = 0; h < H; ++h) {
          const __m256i code = _mm256_srli_epi32(words[h], 4 * c);
          const __m256 w = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, code),
                                         _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(code, 28), sign)));
          for (int m = 0; m < R; ++m)
            partial[m][h][c % kPartials] = _mm256_fmadd_ps(_mm256_set1_ps(xb[m * t.ld_x + k]), w, partial[m][h][c % kPartials]);
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      const uint8_t* s = t.panels + (h / 2) * t.panel_stride + b * kBlockBytes + kGroups * kGroupBytes + (h % 2) * 8;
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
      const __m256i zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
      const __m256 scale = _mm256_castsi256_ps(
          _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000), zero));
      for (int m = 0; m < R; ++m) {
        const __m256 sum = _mm256_add_ps(_mm256_add_ps(partial[m][h][0], partial[m][h][1]),
                                         _mm256_add_ps(partial[m][h][2], partial[m][h][3]));
        total[m][h] = _mm256_fmadd_ps(sum, scale, total[m][h]);
      }
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

// Half as many registers as AVX-512 (16): tiles of at most 2 (row, panel) pairs.
void tile_avx2_dispatch(const Tile& t, int rows, int panels) {
  if (panels == 2) return tile_avx2<1, 2>(t);
  return rows == 1 ? tile_avx2<1, 1>(t) : tile_avx2<2, 1>(t);
}
#endif

// Activation rows for the q8 product: int8_gemm.h's quantised rows with block 32 (the same
// rounding, the same bytes), each group of 8 columns then reordered to its even columns and its odd
// ones (the low and the high nibbles of a group's words). The kernel multiplies q by the doubled
// values plus 12 (unsigned, as vpdpbusd takes its first operand) and subtracts 12 Σ q, which the
// quantised rows' starts hold (−128 Σ q).
constexpr int32_t kValueOffset = 12;

Int8Rows quantize_q8_rows(const float* x, int64_t n, int64_t ld_x, int64_t cols, void* workspace, Mxfp4Kernel kernel) {
  const Int8Rows q = int8_rows_view(workspace, n, cols, kMxfp4Block);
  quantize_int8_rows(x, ld_x, q, 0, n, kernel == Mxfp4Kernel::Portable ? Int8Kernel::Portable : Int8Kernel::Native);
  int64_t i = 0;
#if defined(__AVX512BW__)
  const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
  for (; i + 64 <= n * cols; i += 64) {
    const __m512i v = _mm512_loadu_si512(q.values + i);
    _mm512_storeu_si512(q.values + i, _mm512_shuffle_epi8(v, order));
  }
#endif
  for (; i < n * cols; i += kGroupColumns) {
    int8_t group[kGroupColumns];
    for (int64_t c = 0; c < kGroupColumns; ++c) group[(c % 2) * 4 + c / 2] = q.values[i + c];
    std::memcpy(q.values + i, group, kGroupColumns);
  }
  return q;
}

// −12 Σ q of row r's block b, from the quantised rows' start −128 Σ q.
int32_t value_offset(const Int8Rows& q, int64_t r, int64_t b) {
  return q.starts[r * (q.cols / kMxfp4Block) + b] / 128 * kValueOffset;
}

// The doubled E2M1 values plus 12: integers 0 … 24, what vpdpbusd multiplies q by.
constexpr auto kOffsetTable = [] {
  constexpr int8_t kDoubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  std::array<uint8_t, 16> t{};
  for (int i = 0; i < 16; ++i) t[size_t(i)] = uint8_t(kDoubled[i] + kValueOffset);
  return t;
}();

// 2^(e − 128) as an f32 (e < 255): half the scale, for the doubled values.
float half_scale_value(uint8_t e) { return 0.5f * scale_value(e); }

struct Q8Tile {
  const Int8Rows* x;
  int64_t row0;
  const uint8_t* panels;
  int64_t panel_stride;
  float* y;
  int64_t ld_y, last_rows;
  float beta;
};

// Per output lane and block: the exact integer Σ q·(v + 12) − 12 Σ q, then
// total = fma(float(sum), s_x · 2^(e − 128), total), blocks in order.
void q8_tile_portable(const Q8Tile& t, int rows, int panels) {
  const int64_t cols = t.x->cols, blocks = cols / kMxfp4Block;
  for (int m = 0; m < rows; ++m) {
    const int64_t r = t.row0 + m;
    for (int n = 0; n < panels; ++n) {
      float total[kPanelRows] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* w = t.panels + n * t.panel_stride + b * kBlockBytes;
        const int8_t* q = t.x->values + r * cols + b * kMxfp4Block;
        const float s_x = t.x->scales[r * blocks + b];
        for (int i = 0; i < kPanelRows; ++i) {
          int32_t sum = value_offset(*t.x, r, b);
          for (int64_t k = 0; k < kMxfp4Block; ++k) {
            uint32_t word;
            std::memcpy(&word, w + (k / kGroupColumns) * kGroupBytes + 4 * i, 4);
            const int64_t c = k % kGroupColumns;
            const int32_t v = kOffsetTable[(word >> (4 * c)) & 15];
            sum += int32_t(q[(k / kGroupColumns) * kGroupColumns + (c % 2) * 4 + c / 2]) * v;
          }
          total[i] = std::fma(float(sum), s_x * half_scale_value(w[kGroups * kGroupBytes + i]), total[i]);
        }
      }
      store_lanes(t, m, n, panels, total);
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HYLA_MXFP4_Q8_NATIVE 1
// Four int32 sums per (row, panel) (low and high nibbles × even and odd groups) keep eight chains
// of vpdpbusd in flight for a single row. A group's 64 bytes are one shift, two masks and two
// vpshufb lookups.
template <int R, int P>
void q8_tile_vnni(const Q8Tile& t) {
  const int64_t cols = t.x->cols, blocks = cols / kMxfp4Block;
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kOffsetTable.data())));
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512 total[R][P];
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < P; ++n) total[m][n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i acc[R][P][4];
    for (int m = 0; m < R; ++m) {
      const __m512i offset = _mm512_set1_epi32(value_offset(*t.x, t.row0 + m, b));
      for (int n = 0; n < P; ++n) {
        acc[m][n][0] = offset;
        for (int a = 1; a < 4; ++a) acc[m][n][a] = _mm512_setzero_si512();
      }
    }
#pragma GCC unroll 4
    for (int64_t g = 0; g < kGroups; ++g) {
      for (int n = 0; n < P; ++n) {
        const __m512i words = _mm512_loadu_si512(t.panels + n * t.panel_stride + b * kBlockBytes + g * kGroupBytes);
        const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(words, nibble));
        const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(words, 4), nibble));
        for (int m = 0; m < R; ++m) {
          const int8_t* q = t.x->values + (t.row0 + m) * cols + b * kMxfp4Block + g * kGroupColumns;
          int32_t even, odd;
          std::memcpy(&even, q, 4);
          std::memcpy(&odd, q + 4, 4);
          const int a = int(g % 2) * 2;
          acc[m][n][a] = _mm512_dpbusd_epi32(acc[m][n][a], lo, _mm512_set1_epi32(even));
          acc[m][n][a + 1] = _mm512_dpbusd_epi32(acc[m][n][a + 1], hi, _mm512_set1_epi32(odd));
        }
      }
    }
    for (int n = 0; n < P; ++n) {
      // 2^(e − 128), half the scale for the doubled values (halving a power of two is exact).
      const __m512 scale_w = _mm512_mul_ps(
          _mm512_set1_ps(0.5f), scale_values(t.panels + n * t.panel_stride + b * kBlockBytes + kGroups * kGroupBytes));
      for (int m = 0; m < R; ++m) {
        const __m512i exact = _mm512_add_epi32(_mm512_add_epi32(acc[m][n][0], acc[m][n][1]),
                                               _mm512_add_epi32(acc[m][n][2], acc[m][n][3]));
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(t.x->scales[(t.row0 + m) * blocks + b]), scale_w);
        total[m][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, total[m][n]);
      }
    }
  }
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < P; ++n) {
      float acc[kPanelRows];
      _mm512_storeu_ps(acc, total[m][n]);
      store_lanes(t, m, n, P, acc);
    }
}

void q8_tile_native(const Q8Tile& t, int rows, int panels) {
  if (panels == 2) return rows == 1 ? q8_tile_vnni<1, 2>(t) : q8_tile_vnni<2, 2>(t);
  switch (rows) {
    case 1: return q8_tile_vnni<1, 1>(t);
    case 2: return q8_tile_vnni<2, 1>(t);
    case 3: return q8_tile_vnni<3, 1>(t);
    default: return q8_tile_vnni<4, 1>(t);
  }
}
#endif

// The register tiles of a product over `parts` and n rows of x, in order: per pair of panels, the
// rows in tiles of up to `max_rows`; a tile of at most `max_both` rows covers both panels of the
// pair at once, a larger one each panel in turn. visit(part, column, panel, row, rows, panels,
// last_rows): `column` the part's first output column, `last_rows` the rows of the tile's last
// panel inside the part.
template <class Visit>
void for_each_tile(std::span<const Mxfp4PackedMatrix> parts, int64_t n, int max_rows, int max_both, Visit&& visit) {
  int64_t column = 0;
  for (const Mxfp4PackedMatrix& w : parts) {
    const int64_t panels = panel_count(w.rows);
    for (int64_t p = 0; p < panels; p += 2) {
      const int np = int(std::min<int64_t>(2, panels - p));
      for (int64_t r = 0; r < n;) {
        const int nr = int(std::min<int64_t>(max_rows, n - r));
        const int count = np == 2 && nr <= max_both ? 2 : 1;
        for (int u = 0; u < np; u += count)
          visit(w, column, p + u, r, nr, count, std::min<int64_t>(kPanelRows, w.rows - (p + u + count - 1) * kPanelRows));
        r += nr;
      }
    }
    column += w.rows;
  }
}

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
          for (int64_t g = 0; g < kGroups; ++g) {
            uint32_t word = 0;
            if (r < rows) std::memcpy(&word, codes + r * row_bytes + b * (kMxfp4Block / 2) + 4 * g, 4);
            std::memcpy(out + g * kGroupBytes + 4 * i, &word, 4);
          }
          out[kGroups * kGroupBytes + i] = r < rows ? scales[r * blocks + b] : 0;
        }
      }
  });
}

namespace {

// The low nibbles of 8 bytes, two a byte in order: byte k of the result is x's byte 2k's nibble
// then byte 2k + 1's in the high half (the file form of 8 consecutive values).
uint32_t pair_nibbles(uint64_t x) {
  x &= 0x0F0F0F0F0F0F0F0Full;
  x = (x | x >> 4) & 0x00FF00FF00FF00FFull;
  x = (x | x >> 8) & 0x0000FFFF0000FFFFull;
  return uint32_t(x | x >> 16);
}

}  // namespace

int64_t mxfp4_pack_blocks(const uint8_t* blocks, int64_t rows, int64_t cols, uint8_t* dst) {
  HYLA_ASSERT(cols % kMxfp4Block == 0);
  const int64_t per_row = cols / kMxfp4Block;
  std::atomic<int64_t> first_nan{-1};
  parallel_rows(panel_count(rows), kPanelRows * cols, [&](int64_t begin, int64_t end) {
    // Row after row, so that the blocks are read in file order (each panel's output stays in cache).
    int64_t nan = -1;
    for (int64_t r = begin * kPanelRows; r < std::min(rows, end * kPanelRows); ++r) {
      const int64_t i = r % kPanelRows;
      const uint8_t* block = blocks + r * per_row * kGgmlMxfp4BlockBytes;
      uint8_t* out = dst + (r / kPanelRows) * panel_bytes(cols);  // the panel's block b at out + b · kBlockBytes
      for (int64_t b = 0; b < per_row; ++b, block += kGgmlMxfp4BlockBytes, out += kBlockBytes) {
        if (block[0] == 0xFF && nan < 0) nan = r * per_row + b;
        uint64_t q[2];
        std::memcpy(q, block + 1, 16);
        // Values 0–7 and 8–15 are the low nibbles of bytes 0–7 and 8–15; 16–31 the high ones.
        const uint32_t words[kGroups] = {pair_nibbles(q[0]), pair_nibbles(q[1]), pair_nibbles(q[0] >> 4),
                                         pair_nibbles(q[1] >> 4)};
        for (int64_t g = 0; g < kGroups; ++g) std::memcpy(out + g * kGroupBytes + 4 * i, &words[g], 4);
        out[kGroups * kGroupBytes + i] = block[0];
      }
    }
    // The last panel's missing rows: zero codes and scales, as mxfp4_pack writes them.
    for (int64_t r = rows; r < end * kPanelRows; ++r)
      for (int64_t b = 0; b < per_row; ++b) {
        uint8_t* out = dst + (r / kPanelRows) * panel_bytes(cols) + b * kBlockBytes;
        for (int64_t g = 0; g < kGroups; ++g) std::memset(out + g * kGroupBytes + 4 * (r % kPanelRows), 0, 4);
        out[kGroups * kGroupBytes + r % kPanelRows] = 0;
      }
    for (int64_t seen = first_nan.load(); nan >= 0 && (seen < 0 || nan < seen);)
      if (first_nan.compare_exchange_weak(seen, nan)) break;
  });
  return first_nan.load();
}

float mxfp4_value(uint8_t code, uint8_t scale) { return kValues[code & 15] * scale_value(scale); }

int64_t mxfp4_first_nan_scale(const uint8_t* scales, int64_t n) {
  const uint8_t* hit = std::find(scales, scales + n, uint8_t(0xFF));
  return hit == scales + n ? -1 : hit - scales;
}

int64_t mxfp4_blocks_first_nan_scale(const uint8_t* blocks, int64_t n) {
  for (int64_t b = 0; b < n; ++b)
    if (blocks[b * kGgmlMxfp4BlockBytes] == 0xFF) return b;
  return -1;
}

uint8_t mxfp4_quantize_block(const float* x, uint8_t* codes) {
  float max_abs = 0.0f;
  for (int64_t k = 0; k < kMxfp4Block; ++k) max_abs = std::max(max_abs, std::fabs(x[k]));
  // The largest magnitude maps into [4, 8): e − 127 = floor(log2 max) − 2, kept in [1, 254].
  const int exponent = max_abs > 0.0f ? std::ilogb(max_abs) - 2 : 0;
  const uint8_t e = uint8_t(std::clamp(exponent + 127, 1, 254));
  const float inverse = 1.0f / scale_value(e);  // a power of two: exact
  for (int64_t j = 0; j < kMxfp4Block / 2; ++j) {
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

bool mxfp4_q8_native() {
#if defined(HYLA_MXFP4_Q8_NATIVE)
  return true;
#else
  return false;
#endif
}

int64_t mxfp4_q8_rows_bytes(int64_t rows, int64_t cols) { return int8_rows_bytes(rows, cols, kMxfp4Block); }

void mxfp4_matmul_rows_q8(const float* x, int64_t n, int64_t ld_x, std::span<const Mxfp4PackedMatrix> parts, float* y,
                          int64_t ld_y, float beta, void* workspace, Mxfp4Kernel kernel) {
  HYLA_ASSERT(!parts.empty() && kernel != Mxfp4Kernel::Avx2);
  const Int8Rows q = quantize_q8_rows(x, n, ld_x, parts[0].cols, workspace, kernel);
  [[maybe_unused]] const bool native = kernel == Mxfp4Kernel::Native && mxfp4_q8_native();
  for (const Mxfp4PackedMatrix& w : parts) HYLA_ASSERT(w.cols == q.cols);
  // Tiles of one or two rows on both panels of a pair, three or four on one panel at a time.
  for_each_tile(parts, n, 4, 2, [&](const Mxfp4PackedMatrix& w, int64_t column, int64_t panel, int64_t row, int rows,
                                    int panels, int64_t last_rows) {
    const int64_t stride = panel_bytes(w.cols);
    const Q8Tile t{&q, row, w.data + panel * stride, stride, y + row * ld_y + column + panel * kPanelRows, ld_y,
                   last_rows, beta};
#if defined(HYLA_MXFP4_Q8_NATIVE)
    if (native) return q8_tile_native(t, rows, panels);
#endif
    q8_tile_portable(t, rows, panels);
  });
}

void mxfp4_matmul_rows(const float* x, int64_t n, int64_t ld_x, std::span<const Mxfp4PackedMatrix> parts, float* y,
                       int64_t ld_y, float beta, Mxfp4Kernel kernel) {
  kernel = resolve(kernel);
  HYLA_ASSERT(mxfp4_kernel_available(kernel));
  for (const Mxfp4PackedMatrix& w : parts) HYLA_ASSERT(w.cols % kMxfp4Block == 0);
  // Native tiles: one or two rows on both panels of a pair, three or four on one panel at a time.
  // AVX2 and portable tiles: one row on both panels, two on one.
  const bool native = kernel == Mxfp4Kernel::Native;
  for_each_tile(parts, n, native ? kTileRows : 2, native ? 2 : 1,
                [&](const Mxfp4PackedMatrix& w, int64_t column, int64_t panel, int64_t row, int rows, int panels,
                    int64_t last_rows) {
                  const int64_t stride = panel_bytes(w.cols);
                  const Tile t{x,    ld_x, row, w.cols, w.data + panel * stride, stride,
                               y + row * ld_y + column + panel * kPanelRows, ld_y, last_rows, beta};
                  run_tile(kernel, t, rows, panels);
                });
}

void quantize_mxfp4_weights(const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales) {
  HYLA_ASSERT(cols % kMxfp4Block == 0);
  const int64_t blocks = cols / kMxfp4Block;
  parallel_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t b = 0; b < blocks; ++b)
        scales[r * blocks + b] =
            mxfp4_quantize_block(w + r * cols + b * kMxfp4Block, codes + r * cols / 2 + b * kMxfp4Block / 2);
  });
}

}  // namespace hyla
