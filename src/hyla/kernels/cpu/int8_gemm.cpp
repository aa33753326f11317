#include "hyla/kernels/int8_gemm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/core/team.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/cpu/vec.h"

namespace hyla {
namespace {

constexpr int64_t kPanelRows = 16, kQuadBytes = 64, kMaxStep = 32;
// Register tile of the native kernel: 4 rows of x × 3 panels (48 outputs) hold 12 int32 step
// sums, 12 f32 accumulators and the 3 weight vectors of a quad: 27 of the 32 zmm registers.
constexpr int kTileRows = 4, kTilePanels = 3;
// Rows of x per pass over a thread's panels: their quantised bytes stay in L2 (1 MB per core)
// beside the weight panels, which stream from memory once per pass.
constexpr int64_t kChunkBytes = 256 << 10;
// Below this many multiply-adds a product runs on the calling thread: the fork would cost more.
// A decode team's job costs about half a microsecond; a product of 2^16 int8 weights reads ~72 KB,
// 2-3 µs from L3 (at 2^18, a decoded token's shared experts ran on one thread while the other
// waited, 40% of its serial gaps).
constexpr int64_t kParallelMacs = int64_t(1) << 16;
// Up to this many values of x are quantised by the calling thread alone (~4 ns per 32).
constexpr int64_t kSerialQuantisation = 16 << 10;
// Software prefetch distance along each panel's stream (16 lines ahead): the hardware prefetcher
// alone leaves a single-row product at ~60% of the streaming bandwidth, ~85% with this.
constexpr int64_t kPrefetchBytes = 1024;

int64_t block_bytes(int64_t block) { return block * kPanelRows + kQuadBytes; }
int64_t panel_bytes(int64_t cols, int64_t block) { return cols / block * block_bytes(block); }
int64_t panel_count(int64_t rows) { return ceil_div(rows, kPanelRows); }

// One register tile: some rows of x from row0 on against some consecutive panels of one matrix.
struct Tile {
  const Int8Rows* x;
  int64_t row0;
  const uint8_t* panels;  // the first panel
  int64_t panel_stride;
  float* y;  // output row row0, column of the first panel's first row
  int64_t ld_y;
  int64_t last_rows;  // rows of the last panel inside the matrix (1..16)
  float beta;
  // The first row tile over these panels streams them from memory, prefetching ahead in each
  // panel and the same offsets of the next panels (`next`, or nullptr): memory stays busy while
  // later row tiles compute on these panels from L1, and a single row never waits at the start
  // of a tile's panels (the prefetch within a panel only reaches the next panel's first lines).
  bool first;
  const uint8_t* next;
};

// The same steps as the native kernel, one output lane at a time.
void tile_portable(const Tile& t, int rows, int panels) {
  const Int8Rows& x = *t.x;
  const int64_t blocks = x.cols / x.block, step = int8_step(x.block), steps = x.block / step;
  const int64_t bytes = block_bytes(x.block);
  for (int m = 0; m < rows; ++m) {
    const int64_t r = t.row0 + m;
    for (int n = 0; n < panels; ++n) {
      float acc[kPanelRows] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* w = t.panels + n * t.panel_stride + b * bytes;
        float scale_w[kPanelRows];
        std::memcpy(scale_w, w + x.block / 4 * kQuadBytes, sizeof(scale_w));
        const float scale_x = x.scales[r * blocks + b];
        for (int64_t s = 0; s < steps; ++s) {
          const int8_t* xs = x.values + r * x.cols + b * x.block + s * step;
          const uint8_t* ws = w + s * step / 4 * kQuadBytes;
          int32_t sum[kPanelRows];
          std::fill(sum, sum + kPanelRows, x.starts[r * (x.cols / step) + b * steps + s]);
          for (int64_t k = 0; k < step / 4; ++k)
            for (int i = 0; i < kPanelRows; ++i)
              for (int j = 0; j < 4; ++j) sum[i] += int32_t(ws[k * kQuadBytes + 4 * i + j]) * int32_t(xs[4 * k + j]);
          for (int i = 0; i < kPanelRows; ++i) acc[i] += float(sum[i]) * scale_x * scale_w[i];
        }
      }
      float* out = t.y + m * t.ld_y + n * kPanelRows;
      const int64_t valid = n + 1 < panels ? kPanelRows : t.last_rows;
      for (int64_t i = 0; i < valid; ++i) out[i] = t.beta == 0.0f ? acc[i] : acc[i] + t.beta * out[i];
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

// MR rows × NR panels, steps of QUADS · 4 columns. The step is fully unrolled and the steps of all
// blocks are one flat loop: with a loop inside a step GCC 12 copies the 12 integer accumulators
// between registers on every iteration, and with a loop over blocks around a loop over steps it
// reloads each weight vector once per row (both cost a third of the speed).
template <int MR, int NR, int QUADS>
void tile_native(const Tile& t) {
  const Int8Rows& x = *t.x;
  constexpr int64_t step = 4 * QUADS;
  const int64_t blocks = x.cols / x.block, steps = x.cols / step, bytes = block_bytes(x.block);
  const int shift = std::countr_zero(uint64_t(x.block / step));
  const int8_t* xq = x.values + t.row0 * x.cols;
  const float* scale_x = x.scales + t.row0 * blocks;
  const int32_t* start = x.starts + t.row0 * steps;
  __m512 acc[MR * NR];
  vec::unroll<MR * NR>([&](auto i) { acc[i] = _mm512_setzero_ps(); });
  for (int64_t j = 0; j < steps; ++j) {
    const int64_t b = j >> shift, s = j - (b << shift);
    const uint8_t* w = t.panels + b * bytes;
    __m512i sum[MR * NR];
    vec::unroll<MR>([&](auto m) {
      const __m512i init = _mm512_set1_epi32(start[m * steps + j]);
      vec::unroll<NR>([&](auto n) { sum[m * NR + n] = init; });
    });
    const uint8_t* ws = w + s * QUADS * kQuadBytes;
    const int8_t* xs = xq + j * step;
    vec::unroll<QUADS>([&](auto k) {
      __m512i wq[NR];
      vec::unroll<NR>([&](auto n) {
        const uint8_t* quad = ws + n * t.panel_stride + k * kQuadBytes;
        wq[n] = _mm512_load_si512(quad);
        if (t.first) {
          _mm_prefetch(reinterpret_cast<const char*>(quad + kPrefetchBytes), _MM_HINT_T0);
          if (t.next) _mm_prefetch(reinterpret_cast<const char*>(t.next + (quad - t.panels)), _MM_HINT_T0);
        }
      });
      vec::unroll<MR>([&](auto m) {
        int32_t four;
        std::memcpy(&four, xs + m * x.cols + 4 * k, 4);
        const __m512i x4 = _mm512_set1_epi32(four);
        vec::unroll<NR>([&](auto n) { sum[m * NR + n] = _mm512_dpbusd_epi32(sum[m * NR + n], wq[n], x4); });
      });
    });
    __m512 scale_w[NR];
    vec::unroll<NR>([&](auto n) {
      scale_w[n] = _mm512_load_ps(reinterpret_cast<const float*>(w + n * t.panel_stride + x.block / 4 * kQuadBytes));
    });
    vec::unroll<MR>([&](auto m) {
      const __m512 sx = _mm512_set1_ps(scale_x[m * blocks + b]);
      vec::unroll<NR>([&](auto n) {
        const __m512 step_sum = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[m * NR + n]), sx);
        acc[m * NR + n] = _mm512_fmadd_ps(step_sum, scale_w[n], acc[m * NR + n]);
      });
    });
  }
  const __mmask16 last = __mmask16((1u << t.last_rows) - 1u);
  vec::unroll<MR * NR>([&](auto i) {
    constexpr int m = i / NR, n = i % NR;
    float* out = t.y + m * t.ld_y + n * kPanelRows;
    const __mmask16 mask = n + 1 < NR ? __mmask16(0xffff) : last;
    __m512 v = acc[i];
    if (t.beta != 0.0f) v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, out), _mm512_set1_ps(t.beta), v);
    _mm512_mask_storeu_ps(out, mask, v);
  });
}

using TileFn = void (*)(const Tile&);

template <int QUADS>
void tile_dispatch_native(const Tile& t, int rows, int panels) {
  static_assert(kTileRows == 4 && kTilePanels == 3);
  static constexpr TileFn table[kTileRows][kTilePanels] = {
      {tile_native<1, 1, QUADS>, tile_native<1, 2, QUADS>, tile_native<1, 3, QUADS>},
      {tile_native<2, 1, QUADS>, tile_native<2, 2, QUADS>, tile_native<2, 3, QUADS>},
      {tile_native<3, 1, QUADS>, tile_native<3, 2, QUADS>, tile_native<3, 3, QUADS>},
      {tile_native<4, 1, QUADS>, tile_native<4, 2, QUADS>, tile_native<4, 3, QUADS>}};
  table[rows - 1][panels - 1](t);
}

#endif  // __AVX512VNNI__

#if defined(__AVX2__) && !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
#define HYLA_INT8_AVX2 1

// Without VNNI: a quad's 64 bytes are two ymm registers (panel rows 0–7 and 8–15), multiplied by
// maddubs, which takes one unsigned operand and saturates its pairs' int16 sums. The biased
// weights (q + 128, up to 255) times x (±127) would saturate, so the weights are unbiased back to
// q and the signs move onto x: |q| · (sign(q) · x), each pair at most 2 · 128 · 127 < 2^15, exact.
// (The other way round, sign(x) · q, turns a weight of −128 into −128 again: a GGUF's Q8_0 may
// hold −128.)
// Sums need no starts and run a whole block in int32 (at most 256 · 127² < 2^31). MR ≤ 2 rows of
// x against one panel keep 4·MR accumulators, the quad's two registers and the constants in the
// 16 ymm registers; the panel's bytes are one sequential stream.
template <int MR>
void panel_avx2(const Tile& t, int64_t row0, int panel, int64_t valid) {
  const Int8Rows& x = *t.x;
  const int64_t blocks = x.cols / x.block, quads = x.block / 4, bytes = block_bytes(x.block);
  const uint8_t* panel_bytes = t.panels + panel * t.panel_stride;
  const __m256i bias = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi16(1);
  __m256 acc[2 * MR];
  vec::unroll<2 * MR>([&](auto i) { acc[i] = _mm256_setzero_ps(); });
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* w = panel_bytes + b * bytes;
    __m256i sum[2 * MR];
    vec::unroll<2 * MR>([&](auto i) { sum[i] = _mm256_setzero_si256(); });
    for (int64_t k = 0; k < quads; ++k) {
      const uint8_t* quad = w + k * kQuadBytes;
      if (t.first) _mm_prefetch(reinterpret_cast<const char*>(quad + kPrefetchBytes), _MM_HINT_T0);
      const __m256i q[2] = {_mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(quad)), bias),
                            _mm256_xor_si256(_mm256_load_si256(reinterpret_cast<const __m256i*>(quad + 32)), bias)};
      const __m256i magnitude[2] = {_mm256_abs_epi8(q[0]), _mm256_abs_epi8(q[1])};
      vec::unroll<MR>([&](auto m) {
        int32_t four;
        std::memcpy(&four, x.values + (row0 + m) * x.cols + b * x.block + 4 * k, 4);
        const __m256i x4 = _mm256_set1_epi32(four);
        vec::unroll<2>([&](auto h) {
          const __m256i pairs = _mm256_maddubs_epi16(magnitude[h], _mm256_sign_epi8(x4, q[h]));
          sum[2 * m + h] = _mm256_add_epi32(sum[2 * m + h], _mm256_madd_epi16(pairs, ones));
        });
      });
    }
    const float* scale_w = reinterpret_cast<const float*>(w + quads * kQuadBytes);
    const __m256 sw[2] = {_mm256_load_ps(scale_w), _mm256_load_ps(scale_w + 8)};
    vec::unroll<MR>([&](auto m) {
      const __m256 sx = _mm256_set1_ps(x.scales[(row0 + m) * blocks + b]);
      vec::unroll<2>([&](auto h) {
        acc[2 * m + h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum[2 * m + h]), sx), sw[h], acc[2 * m + h]);
      });
    });
  }
  vec::unroll<MR>([&](auto m) {
    alignas(32) float out[kPanelRows];
    _mm256_store_ps(out, acc[2 * m]);
    _mm256_store_ps(out + 8, acc[2 * m + 1]);
    float* y = t.y + (row0 - t.row0 + m) * t.ld_y + panel * kPanelRows;
    for (int64_t i = 0; i < valid; ++i) y[i] = t.beta == 0.0f ? out[i] : out[i] + t.beta * y[i];
  });
}

void tile_avx2(const Tile& t, int rows, int panels) {
  for (int n = 0; n < panels; ++n) {
    const int64_t valid = n + 1 < panels ? kPanelRows : t.last_rows;
    int m = 0;
    for (; m + 2 <= rows; m += 2) panel_avx2<2>(t, t.row0 + m, n, valid);
    if (m < rows) panel_avx2<1>(t, t.row0 + m, n, valid);
  }
}

#endif

void run_tile(const Tile& t, int rows, int panels, Int8Kernel kernel) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if (kernel == Int8Kernel::Native) {
    if (int8_step(t.x->block) == kMaxStep) tile_dispatch_native<kMaxStep / 4>(t, rows, panels);
    else tile_dispatch_native<4>(t, rows, panels);
    return;
  }
#endif
#if defined(HYLA_INT8_AVX2)
  if (kernel == Int8Kernel::Native) return tile_avx2(t, rows, panels);
#endif
  (void)kernel;
  tile_portable(t, rows, panels);
}

// Output panels [first, last) of the stacked parts (numbered across parts) for every row of x.
void run_panels(const Int8Rows& x, std::span<const Int8PackedMatrix> parts, int64_t first, int64_t last, float* y,
                int64_t ld_y, float beta, Int8Kernel kernel) {
  const int64_t chunk = std::max<int64_t>(kTileRows, kChunkBytes / x.cols / kTileRows * kTileRows);
  int64_t part_first = 0, column = 0;
  for (const Int8PackedMatrix& w : parts) {
    const int64_t panels = panel_count(w.rows), stride = panel_bytes(w.cols, w.block);
    const int64_t lo = std::max(first, part_first) - part_first, hi = std::min(last, part_first + panels) - part_first;
    for (int64_t r0 = 0; lo < hi && r0 < x.rows; r0 += chunk) {
      const int64_t r1 = std::min(x.rows, r0 + chunk);
      for (int64_t p = lo; p < hi; p += kTilePanels) {
        const int np = int(std::min<int64_t>(kTilePanels, hi - p));
        const int64_t last_rows = std::min(kPanelRows, w.rows - (p + np - 1) * kPanelRows);
        const uint8_t* next = p + np < hi ? w.data + (p + np) * stride : nullptr;
        for (int64_t r = r0; r < r1; r += kTileRows) {
          const Tile t{&x,   r,         w.data + p * stride, stride, y + r * ld_y + column + p * kPanelRows,
                       ld_y, last_rows, beta,               r == r0, next};
          run_tile(t, int(std::min<int64_t>(kTileRows, r1 - r)), np, kernel);
        }
      }
    }
    part_first += panels;
    column += w.rows;
  }
}

// Row r of x to q = x · (127 / max|x|) per block, rounded to nearest even and clamped to ±127,
// with the blocks' scales and the steps' accumulator starts. Both versions use the same f32
// products and IEEE divisions, so for finite x they write the same bytes (and neither has
// undefined behaviour on NaN: the clamp sends it to −127).
void quantize_row_portable(const float* x, const Int8Rows& out, int64_t r) {
  const int64_t block = out.block, step = int8_step(block);
  // Adding and subtracting 1.5 · 2^23 rounds |v| < 2^22 to an integer, to nearest even, in plain
  // f32 arithmetic the compiler vectorises (std::nearbyint would be a call per value).
  constexpr float kRound = 0x1.8p23f;
  for (int64_t b = 0; b < out.cols / block; ++b) {
    const float* xb = x + b * block;
    float max_abs = 0.0f;
    for (int64_t k = 0; k < block; ++k) max_abs = std::max(max_abs, std::fabs(xb[k]));
    const float inv = max_abs > 0.0f ? 127.0f / max_abs : 0.0f;
    out.scales[r * (out.cols / block) + b] = max_abs / 127.0f;
    for (int64_t s = 0; s < block; s += step) {
      int8_t* q = out.values + r * out.cols + b * block + s;
      int32_t total = 0;
      for (int64_t k = 0; k < step; ++k) {
        float v = xb[s + k] * inv;
        v = v >= -127.0f ? v : -127.0f;
        v = v <= 127.0f ? v : 127.0f;
        const int32_t qi = int32_t((v + kRound) - kRound);
        q[k] = int8_t(qi);
        total += qi;
      }
      out.starts[r * (out.cols / step) + (b * block + s) / step] = -128 * total;
    }
  }
}

#if defined(HYLA_INT8_AVX2)

// quantize_row_portable's steps, 8 values at a time: the same f32 products, divisions, clamps and
// rounding (cvtps2dq under MXCSR's default, nearest even), so the same bytes. The starts are kept
// for the portable kernel, which the AVX2 tile does not need.
void quantize_row_avx2(const float* x, const Int8Rows& out, int64_t r) {
  const int64_t block = out.block, blocks = out.cols / block, step = int8_step(block);
  const __m256 limit = _mm256_set1_ps(127.0f), low = _mm256_set1_ps(-127.0f);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * block;
    __m256 m = _mm256_setzero_ps();
    // |x| first: maxps returns its second operand when either is NaN, so a NaN is skipped as
    // std::max skips it in the portable loop.
    for (int64_t k = 0; k < block; k += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + k), magnitude), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float max_abs = _mm_cvtss_f32(h);
    const __m256 inv = _mm256_set1_ps(max_abs > 0.0f ? 127.0f / max_abs : 0.0f);
    out.scales[r * blocks + b] = max_abs / 127.0f;
    for (int64_t s = 0; s < block; s += step) {
      int8_t* q = out.values + r * out.cols + b * block + s;
      __m256i total = _mm256_setzero_si256();
      for (int64_t k = 0; k < step; k += 8) {
        const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + s + k), inv), low), limit);
        const __m256i qi = _mm256_cvtps_epi32(v);
        total = _mm256_add_epi32(total, qi);
        const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_packs_epi16(words, words));
      }
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
      out.starts[r * (out.cols / step) + (b * block + s) / step] = -128 * _mm_cvtsi128_si32(t);
    }
  }
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)

// Lane i: the maximum of v[i]'s 16 lanes (vec::sum_each's shuffle network with max for +).
__m512 max_each(const __m512* v) {
  __m512 w[8], x[4], z[2];
  vec::unroll<4>([&](auto b) {
    vec::unroll<2>([&](auto c) {
      const __m512 a = v[b + 8 * c], d = v[b + 4 + 8 * c];
      w[2 * b + c] = _mm512_max_ps(_mm512_shuffle_f32x4(a, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(a, d, _MM_SHUFFLE(3, 2, 3, 2)));
    });
  });
  vec::unroll<4>([&](auto i) {
    const __m512 c = w[2 * i], d = w[2 * i + 1];
    x[i] = _mm512_max_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 1, 3, 1)));
  });
  vec::unroll<2>([&](auto i) {
    const __m512 e = x[2 * i], f = x[2 * i + 1];
    z[i] = _mm512_max_ps(_mm512_shuffle_ps(e, f, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(e, f, _MM_SHUFFLE(3, 2, 3, 2)));
  });
  return _mm512_max_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// 16 blocks at a time: their maxima, scales and inverses as vectors (one reduction network and
// two divisions instead of 16 horizontal maxima and divisions, whose latency chains made the
// per-block loop cost ~28 cycles a block), then 16 steps at a time likewise for the starts.
void quantize_row_native(const float* x, const Int8Rows& out, int64_t r) {
  const int64_t block = out.block, blocks = out.cols / block, step = int8_step(block), steps = out.cols / step;
  const __m512 limit = _mm512_set1_ps(127.0f), low = _mm512_set1_ps(-127.0f);
  alignas(64) float inv[16];
  for (int64_t b0 = 0; b0 < blocks; b0 += 16) {
    const int64_t nb = std::min<int64_t>(16, blocks - b0);
    __m512 top[16];
    vec::unroll<16>([&](auto i) {
      __m512 m = _mm512_setzero_ps();
      if (i < nb)
        for (int64_t k = (b0 + i) * block; k < (b0 + i + 1) * block; k += 16)
          m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
      top[i] = m;
    });
    const __m512 maxima = max_each(top);
    const __mmask16 valid = __mmask16((1u << nb) - 1u);
    _mm512_mask_storeu_ps(out.scales + r * blocks + b0, valid, _mm512_div_ps(maxima, limit));
    _mm512_store_ps(inv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(maxima, _mm512_setzero_ps(), _CMP_GT_OQ), limit, maxima));
    const int64_t s1 = (b0 + nb) * block / step;
    for (int64_t j0 = b0 * block / step; j0 < s1; j0 += 16) {
      const int64_t count = std::min<int64_t>(16, s1 - j0);
      __m512 sums[16];  // per step: its q summed lane-wise (exact: |Σ| ≤ 2 · 127 per lane)
      vec::unroll<16>([&](auto i) {
        __m512i sum = _mm512_setzero_si512();
        if (i < count) {
          const int64_t k0 = (j0 + i) * step;
          const __m512 scale = _mm512_set1_ps(inv[k0 / block - b0]);
          for (int64_t k = k0; k < k0 + step; k += 16) {
            const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x + k), scale), low), limit);
            const __m512i qi = _mm512_cvtps_epi32(v);  // MXCSR's default rounding: nearest even
            sum = _mm512_add_epi32(sum, qi);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out.values + r * out.cols + k), _mm512_cvtepi32_epi8(qi));
          }
        }
        sums[i] = _mm512_cvtepi32_ps(sum);
      });
      // Integer totals ≤ 32 · 127 in magnitude: exact in f32 through the whole reduction.
      const __m512i totals = _mm512_cvtps_epi32(vec::sum_each(sums));
      _mm512_mask_storeu_epi32(out.starts + r * steps + j0, __mmask16((1u << count) - 1u),
                               _mm512_mullo_epi32(totals, _mm512_set1_epi32(-128)));
    }
  }
}

#endif

}  // namespace

bool int8_block_supported(int64_t block) {
  return block >= 16 && block <= 256 && (block & (block - 1)) == 0;
}

int64_t int8_step(int64_t block) { return std::min(block, kMaxStep); }

bool int8_native_kernels() {
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__)) || defined(HYLA_INT8_AVX2)
  return true;
#else
  return false;
#endif
}

int64_t int8_packed_bytes(int64_t rows, int64_t cols, int64_t block) {
  HYLA_ASSERT(int8_block_supported(block) && cols % block == 0);
  return panel_count(rows) * panel_bytes(cols, block);
}

void int8_pack(const int8_t* values, const float* scales, int64_t rows, int64_t cols, int64_t block, uint8_t* dst) {
  HYLA_ASSERT(int8_block_supported(block) && cols % block == 0);
  const int64_t blocks = cols / block, quads = block / 4, bytes = block_bytes(block);
  constexpr uint32_t kBias = 0x80808080u;  // q + 128 in every byte of a word is q ^ 0x80
  // A quad is one 32-bit word (4 consecutive values) from each of a panel's 16 rows: a full panel
  // gathers the 16 words with one instruction (expert offload packs an expert on every cache miss,
  // so this runs on the decode path).
  parallel_rows(panel_count(rows), kPanelRows * cols, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t first = p * kPanelRows;
      [[maybe_unused]] const bool full = first + kPanelRows <= rows;
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* out = dst + p * panel_bytes(cols, block) + b * bytes;
        const int8_t* panel = values + first * cols + b * block;
#if defined(__AVX512F__)
        if (full && (kPanelRows - 1) * cols < (int64_t(1) << 31)) {  // the gather's offsets are int32 bytes
          const __m512i words = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                   _mm512_set1_epi32(int32_t(cols / 4)));
          for (int64_t k = 0; k < quads; ++k) {
            const __m512i quad = _mm512_i32gather_epi32(words, panel + 4 * k, 4);
            _mm512_store_si512(out + k * kQuadBytes, _mm512_xor_si512(quad, _mm512_set1_epi32(int32_t(kBias))));
          }
          for (int64_t i = 0; i < kPanelRows; ++i) std::memcpy(out + quads * kQuadBytes + 4 * i, &scales[(first + i) * blocks + b], 4);
          continue;
        }
#endif
        for (int64_t i = 0; i < kPanelRows; ++i) {
          const int64_t r = first + i;
          for (int64_t k = 0; k < quads; ++k) {
            uint32_t word = kBias;
            if (r < rows) std::memcpy(&word, panel + i * cols + 4 * k, 4), word ^= kBias;
            std::memcpy(out + k * kQuadBytes + 4 * i, &word, 4);
          }
          const float scale = r < rows ? scales[r * blocks + b] : 0.0f;
          std::memcpy(out + quads * kQuadBytes + 4 * i, &scale, 4);
        }
      }
    }
  });
}

int64_t int8_rows_bytes(int64_t rows, int64_t cols, int64_t block) {
  return round_up(rows * cols, 64) + round_up(rows * (cols / block) * 4, 64) +
         round_up(rows * (cols / int8_step(block)) * 4, 64);
}

Int8Rows int8_rows_view(void* workspace, int64_t rows, int64_t cols, int64_t block) {
  HYLA_ASSERT(int8_block_supported(block) && cols % block == 0);
  auto* p = static_cast<uint8_t*>(workspace);
  const int64_t values = round_up(rows * cols, 64), scales = round_up(rows * (cols / block) * 4, 64);
  Int8Rows r;
  r.values = reinterpret_cast<int8_t*>(p);
  r.scales = reinterpret_cast<float*>(p + values);
  r.starts = reinterpret_cast<int32_t*>(p + values + scales);
  r.rows = rows, r.cols = cols, r.block = block;
  return r;
}

void quantize_int8_rows(const float* x, int64_t ld_x, const Int8Rows& out, int64_t first, int64_t last,
                        Int8Kernel kernel) {
  for (int64_t r = first; r < last; ++r) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (kernel == Int8Kernel::Native) {
      quantize_row_native(x + r * ld_x, out, r);
      continue;
    }
#endif
#if defined(HYLA_INT8_AVX2)
    if (kernel == Int8Kernel::Native) {
      quantize_row_avx2(x + r * ld_x, out, r);
      continue;
    }
#endif
    (void)kernel;
    quantize_row_portable(x + r * ld_x, out, r);
  }
}

void int8_matmul_rows(const Int8Rows& x, std::span<const Int8PackedMatrix> parts, float* y, int64_t ld_y, float beta,
                      Int8Kernel kernel) {
  int64_t panels = 0;
  for (const Int8PackedMatrix& w : parts) {
    HYLA_ASSERT(w.cols == x.cols && w.block == x.block);
    panels += panel_count(w.rows);
  }
  run_panels(x, parts, 0, panels, y, ld_y, beta, kernel);
}

void int8_matmul(const float* x, int64_t n, int64_t ld_x, std::span<const Int8PackedMatrix> parts, float* y,
                 int64_t ld_y, float beta, void* workspace, Int8Kernel kernel) {
  HYLA_ASSERT(!parts.empty());
  const int64_t cols = parts[0].cols;
  int64_t panels = 0, rows = 0;
  for (const Int8PackedMatrix& w : parts) {
    HYLA_ASSERT(w.cols == cols && w.block == parts[0].block);
    panels += panel_count(w.rows);
    rows += w.rows;
  }
  const Int8Rows xq = int8_rows_view(workspace, n, cols, parts[0].block);
  const bool parallel = n * rows * cols >= kParallelMacs && panels > 1;
  // A few rows (decode) are quantised by the caller: waking the team for them would cost more.
  if (parallel && n * cols > kSerialQuantisation)
    parallel_for(n, 1, [&](int, int64_t first, int64_t last) { quantize_int8_rows(x, ld_x, xq, first, last, kernel); });
  else
    quantize_int8_rows(x, ld_x, xq, 0, n, kernel);
  // Pieces of whole tiles, a few per thread (see skinny_gemm).
  const int64_t tiles = ceil_div(panels, int64_t(kTilePanels));
  const int64_t grain = parallel ? std::max<int64_t>(1, tiles / (4 * num_threads())) * kTilePanels : panels;
  parallel_for(panels, grain, [&](int, int64_t first, int64_t last) {
    run_panels(xq, parts, first, last, y, ld_y, beta, kernel);
  });
}

void quantize_int8_weights(const float* w, int64_t rows, int64_t cols, int64_t block, int8_t* values, float* scales) {
  HYLA_ASSERT(cols % block == 0);
  const int64_t blocks = cols / block;
  parallel_rows(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const float* x = w + r * cols + b * block;
        int8_t* q = values + r * cols + b * block;
        float max_abs = 0.0f;
        for (int64_t k = 0; k < block; ++k) max_abs = std::max(max_abs, std::fabs(x[k]));
        const float scale = max_abs / 127.0f;
        scales[r * blocks + b] = scale;
        for (int64_t k = 0; k < block; ++k)
          q[k] = scale > 0.0f ? int8_t(std::clamp(std::nearbyint(x[k] / scale), -127.0f, 127.0f)) : int8_t(0);
      }
  });
}

}  // namespace hyla
