#include "hyla/kernels/cpu/latent_attention_amx.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/kernels/cpu/instruction_set.h"
#include "hyla/kernels/cpu/amx_tiles.h"
#include "hyla/kernels/cpu/vec.h"

namespace hyla::latent_amx {

#if defined(HYLA_AMX_TILES)

namespace {

using vec::Vec;

constexpr int64_t kBlockRows = 64;  // cached rows per score pass: four tiles of 16
constexpr int64_t kStepRows = 32;   // cached rows per value product (a tile's 32 bf16 columns)
constexpr int64_t kChunk = 32;      // values of a row per score product (a tile row of 64 bytes)
constexpr int64_t kBlock = 16;      // output values per value tile
constexpr int kAccumulators = 6;    // value tiles per pass: tiles 0-5, A in 6, B in 7

// Heads per group: the score tiles' columns and the value tiles' rows. The narrowest of 4, 8 and
// 16 that holds the heads (more heads take groups of 16): the softmax and the probabilities'
// transpose work on whole groups, padding heads included.
int64_t group_width(int64_t heads) { return heads <= 4 ? 4 : heads <= 8 ? 8 : 16; }
int64_t groups_of(int64_t heads) { return ceil_div(heads, group_width(heads)); }

using amx::TileConfig;

// Scores: accumulators 0-3 [16 rows × w heads] f32, the cached rows in 4 [16 × 32] bf16, the
// query in 5 [16 pairs × w heads].
TileConfig score_config(int64_t w) {
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.bytes_per_row[t] = uint16_t(4 * w);
  c.rows[4] = 16, c.bytes_per_row[4] = 64;
  c.rows[5] = 16, c.bytes_per_row[5] = uint16_t(4 * w);
  return c;
}

// Values: accumulators 0-5 [w heads × 16 values] f32, the probabilities in 6 [w heads × 32 rows]
// bf16, two interleaved rows' values in 7 [16 pairs × 16 values].
TileConfig value_config(int64_t w) {
  TileConfig c;
  for (int t = 0; t < 7; ++t) c.rows[t] = uint8_t(w), c.bytes_per_row[t] = 64;
  c.rows[7] = 16, c.bytes_per_row[7] = 64;
  return c;
}

// The scratch's pieces for a unit of up to `rows` cached rows (a multiple of kBlockRows), 64-byte
// aligned. Everything a unit computes is kept until its next phase: the TMUL unit idles between
// tile instructions that other work separates (measured here: a 64-row score pass took 175 ns
// back to back, 440 ns after ~1.5 µs of vector work, 920 ns after ~4 µs), so each phase runs over
// the whole unit at once.
struct Scratch {
  float* scores;      // [groups][rows][w]: scores, then probabilities
  uint32_t* probs;    // [groups][rows / 32][w heads][16 pairs]: A tiles of the value products
  uint32_t* values;   // [rows / 32][R / 16][16 pairs][16]: B tiles, two rows interleaved
  bf16* staged;       // [kBlockRows][K]: the unit's last rows padded with zeros
  float* block_out;   // [w][16]: one value tile on its way to the output
  size_t size;        // bytes from the start

  // At `start` (0 to count the bytes only).
  Scratch(uintptr_t start, int64_t heads, int64_t latent, int64_t K, int64_t rows) {
    uintptr_t p = start;
    const int64_t G = groups_of(heads), w = group_width(heads);
    auto take = [&](int64_t bytes) {
      const uintptr_t at = p;
      p += uintptr_t(round_up(bytes, 64));
      return at;
    };
    scores = reinterpret_cast<float*>(take(G * rows * w * 4));
    probs = reinterpret_cast<uint32_t*>(take(G * rows / kStepRows * w * 16 * 4));
    values = reinterpret_cast<uint32_t*>(take(rows * latent * 2));
    staged = reinterpret_cast<bf16*>(take(kBlockRows * K * 2));
    block_out = reinterpret_cast<float*>(take(w * 16 * 4));
    size = size_t(p - start);
  }
};

// Each lane's value folded with the lanes of the same head (lanes w apart): lane j of the result
// is op over lanes j mod w, j mod w + w, ... (a vector holds 16 / w rows of a group's heads).
template <typename Op>
Vec fold_heads(Vec v, int64_t w, Op op) {
  if (w <= 8) v = op(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // swap the 256-bit halves
  if (w <= 4) v = op(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // swap the 128-bit quarters in each
  return v;
}

// Softmax of a group's scores [rows][w] over rows [0, n) (16 / w rows a vector, lane j head
// j mod w): they become exp(s − m) with m their head's max, rows [n, padded) become 0; writes m and
// the sum l of each head to lanes [0, w) of m and l.
void softmax_rows(float* scores, int64_t w, int64_t n, int64_t padded, float* m, float* l) {
  const int64_t values = n * w, whole = values / vec::kLanes * vec::kLanes;
  const vec::Mask tail = vec::lane_range(0, values - whole);
  const auto max = [](Vec a, Vec b) { return vec::max(a, b); };
  Vec mx = vec::negative_infinity();
  for (int64_t i = 0; i < whole; i += vec::kLanes) mx = vec::max(mx, vec::load(scores + i));
  if (whole < values)
    mx = vec::max(mx, _mm512_mask_loadu_ps(vec::negative_infinity(), tail, scores + whole));
  mx = fold_heads(mx, w, max);
  // A head that has seen only -inf keeps max -inf; subtracting 0 instead keeps exp at 0, not NaN.
  const Vec shift = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mx, vec::negative_infinity(), _CMP_EQ_OQ), mx, vec::zero());
  Vec sum = vec::zero();
  for (int64_t i = 0; i < whole; i += vec::kLanes) {
    const Vec e = vec::exp(vec::load(scores + i) - shift);
    vec::store(scores + i, e);
    sum = sum + e;
  }
  if (whole < values) {
    const Vec e = _mm512_maskz_mov_ps(tail, vec::exp(vec::load(scores + whole, tail) - shift));
    vec::store(scores + whole, e, tail);
    sum = sum + e;
  }
  std::fill(scores + values, scores + padded * w, 0.0f);
  sum = fold_heads(sum, w, [](Vec a, Vec b) { return a + b; });
  vec::store(m, mx, vec::lane_range(0, w));
  vec::store(l, sum, vec::lane_range(0, w));
}

// The A tile of a value product from 32 rows of a group's probabilities [32][w]: row h holds the
// pairs (p[2i][h], p[2i + 1][h]) for i < 16.
void transpose_probabilities(const float* p, int64_t w, uint32_t* tile) {
  // vcvtne2ps2bf16 puts the odd rows' 16 values above the even rows'; vpermw interleaves them into
  // one pair per row pair.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i even = _mm512_mullo_epi32(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                                          _mm512_set1_epi32(int(w)));
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(int(w)));
  for (int64_t h = 0; h < w; ++h) {
    const Vec lo = _mm512_i32gather_ps(even, p + h, 4), hi = _mm512_i32gather_ps(odd, p + h, 4);
    const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    _mm512_store_si512(tile + h * 16, _mm512_permutexvar_epi16(interleave, halves));
  }
}

// Rows ahead that interleave_rows prefetches: a plain copy of the rows out of DRAM went from 14 to
// 28 GB/s with it here. Past the unit's rows the prefetches touch the cache's next rows or
// nothing of ours, and never fault.
constexpr int64_t kPrefetchRows = 32;

// The B tiles of the value product over 32 rows: for 32-value segment j of the rows, block 2j
// holds vpunpcklwd of rows 2i and 2i + 1 in its row i and block 2j + 1 their vpunpckhwd.
void interleave_rows(const bf16* rows, int64_t K, int64_t R, uint32_t* tiles) {
  for (int i = 0; i < 16; ++i) {
    const bf16* a = rows + 2 * i * K;
    const bf16* b = a + K;
    for (int64_t j = 0; j < R / 32; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(a + kPrefetchRows * K + 32 * j), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetchRows * K + 32 * j), _MM_HINT_T0);
      const __m512i x = _mm512_loadu_si512(a + 32 * j), y = _mm512_loadu_si512(b + 32 * j);
      _mm512_store_si512(tiles + (2 * j * 16 + i) * 16, _mm512_unpacklo_epi16(x, y));
      _mm512_store_si512(tiles + ((2 * j + 1) * 16 + i) * 16, _mm512_unpackhi_epi16(x, y));
    }
  }
}

// Undoes vpunpck's order in each 32-value segment of an output row: lanes 4i + j of the low block
// hold value 8i + j, of the high block 8i + 4 + j.
void order_segments(float* row, int64_t R) {
  float tmp[32];
  for (int64_t c0 = 0; c0 < R; c0 += 32) {
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        tmp[8 * i + j] = row[c0 + 4 * i + j];
        tmp[8 * i + 4 + j] = row[c0 + 16 + 4 * i + j];
      }
    std::copy(tmp, tmp + 32, row + c0);
  }
}

}  // namespace

bool usable(int64_t heads, int64_t latent, int64_t K) {
  return heads > 0 && latent % 32 == 0 && K % kChunk == 0 && amx_tiles();
}

size_t query_words(int64_t heads, int64_t K) {
  return size_t(groups_of(heads) * (K / kChunk) * 16 * group_width(heads));
}

void pack_query(int64_t heads, int64_t K, float scale, const float* q, uint32_t* out) {
  const int64_t G = groups_of(heads), w = group_width(heads), chunks = K / kChunk;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t i = 0; i < 16; ++i)
        for (int64_t n = 0; n < w; ++n) {
          const int64_t h = g * w + n, k = c * kChunk + 2 * i;
          const float lo = h < heads ? scale * q[h * K + k] : 0.0f, hi = h < heads ? scale * q[h * K + k + 1] : 0.0f;
          out[((g * chunks + c) * 16 + i) * w + n] = uint32_t(to_bf16(lo).bits) | uint32_t(to_bf16(hi).bits) << 16;
        }
}

size_t thread_bytes(int64_t heads, int64_t latent, int64_t K, int64_t max_rows) {
  return Scratch(0, heads, latent, K, round_up(max_rows, kBlockRows)).size + 64;  // + aligning the start
}

void run_unit(int64_t heads, int64_t latent, int64_t K, const bf16* rows, int64_t begin, int64_t end,
              const uint32_t* query, float* partial, void* scratch) {
  const int64_t H = heads, R = latent, G = groups_of(H), w = group_width(H), chunks = K / kChunk, blocks = R / kBlock;
  const int64_t n = end - begin, padded = round_up(n, kBlockRows), steps = padded / kStepRows;
  const Scratch s((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t(63), H, R, K, padded);
  const bf16* unit = rows + begin * K;
  const int64_t ld_rows = K * int64_t(sizeof(bf16)), ld_scores = w * int64_t(sizeof(float));
  // Row t of the unit (t a multiple of 32): the cache's, or in a last 64-row block cut short, the
  // staged copy of its rows then zeros (nothing past `end` is read).
  const int64_t whole = n / kBlockRows * kBlockRows;
  if (whole < n) {
    std::memcpy(s.staged, unit + whole * K, size_t((n - whole) * K) * sizeof(bf16));
    std::memset(static_cast<void*>(s.staged + (n - whole) * K), 0, size_t((padded - n) * K) * sizeof(bf16));
  }
  const auto rows_at = [&](int64_t t) { return t < whole ? unit + t * K : s.staged + (t - whole) * K; };
  // The rows are read first by vector loads in order, which stream from memory (a tile load waits
  // for its 16 rows' lines: from beyond L2 the score products ran at a third of a plain read's
  // rate); the score products then find them in L2.
  for (int64_t step = 0; step < steps; ++step)
    interleave_rows(rows_at(step * kStepRows), K, R, s.values + step * blocks * 256);
  const TileConfig scores_tiles = score_config(w), values_tiles = value_config(w);
  _tile_loadconfig(&scores_tiles);
  for (int64_t g = 0; g < G; ++g) {
    float* scores = s.scores + g * padded * w;
    for (int64_t t0 = 0; t0 < padded; t0 += kBlockRows) {
      const bf16* block = rows_at(t0);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t c = 0; c < chunks; ++c) {
        _tile_loadd(5, query + (g * chunks + c) * 16 * w, ld_scores);
        const bf16* chunk = block + c * kChunk;
        _tile_loadd(4, chunk, ld_rows);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(4, chunk + 16 * K, ld_rows);
        _tile_dpbf16ps(1, 4, 5);
        _tile_loadd(4, chunk + 32 * K, ld_rows);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(4, chunk + 48 * K, ld_rows);
        _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(0, scores + t0 * w, ld_scores);
      _tile_stored(1, scores + (t0 + 16) * w, ld_scores);
      _tile_stored(2, scores + (t0 + 32) * w, ld_scores);
      _tile_stored(3, scores + (t0 + 48) * w, ld_scores);
    }
  }
  alignas(64) float m[16], l[16];
  for (int64_t g = 0; g < G; ++g) {
    float* scores = s.scores + g * padded * w;
    softmax_rows(scores, w, n, padded, m, l);
    const int64_t group_heads = std::min(w, H - g * w);
    std::copy(m, m + group_heads, partial + H * R + g * w);
    std::copy(l, l + group_heads, partial + H * R + H + g * w);
    for (int64_t step = 0; step < steps; ++step)
      transpose_probabilities(scores + step * kStepRows * w, w, s.probs + (g * steps + step) * w * 16);
  }
  _tile_loadconfig(&values_tiles);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t group_heads = std::min(w, H - g * w);
    for (int64_t b0 = 0; b0 < blocks; b0 += kAccumulators) {
      const int nb = int(std::min<int64_t>(kAccumulators, blocks - b0));
      for (int b = 0; b < nb; ++b) amx::zero(b);
      for (int64_t step = 0; step < steps; ++step) {
        _tile_loadd(6, s.probs + (g * steps + step) * w * 16, 64);
        for (int b = 0; b < nb; ++b) {
          _tile_loadd(7, s.values + (step * blocks + b0 + b) * 256, 64);
          amx::accumulate(b);
        }
      }
      for (int b = 0; b < nb; ++b) {
        amx::store(b, s.block_out, 64);
        for (int64_t h = 0; h < group_heads; ++h)
          std::memcpy(partial + (g * w + h) * R + (b0 + b) * kBlock, s.block_out + h * 16, 16 * sizeof(float));
      }
    }
  }
  _tile_release();
  for (int64_t h = 0; h < H; ++h) order_segments(partial + h * R, R);
}

#else  // without AMX, usable() is false and nothing else here is called

bool usable(int64_t, int64_t, int64_t) { return false; }
size_t query_words(int64_t, int64_t) { return 0; }
void pack_query(int64_t, int64_t, float, const float*, uint32_t*) { HYLA_ASSERT(false); }
size_t thread_bytes(int64_t, int64_t, int64_t, int64_t) { return 0; }
void run_unit(int64_t, int64_t, int64_t, const bf16*, int64_t, int64_t, const uint32_t*, float*, void*) {
  HYLA_ASSERT(false);
}

#endif

}  // namespace hyla::latent_amx
