#include "hyla/kernels/latent_attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/memory.h"
#include "hyla/core/team.h"
#include "hyla/kernels/cpu/instruction_set.h"
#include "hyla/kernels/cpu/latent_attention_amx.h"
#include "hyla/kernels/cpu/vec.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {

using namespace vec;

namespace {

// Rows [begin, end) of sequence `seq`'s cache: one unit of parallel work.
struct Unit {
  int64_t seq, begin, end;
};

// Cached rows per tile: a tile's rows (16 KB at R = 128 in bf16) and scores stay in L1 across
// the score pass and the value passes that reread them.
constexpr int64_t kTile = 64;
// A sequence is cut into units of a quarter of its rows, kept within 128 to 1024 rows: enough
// units for the threads when one sequence decodes alone, few enough partial results (H·R floats
// each) that writing and merging them stays a small fraction of reading the cache, and long enough
// that a unit's fixed costs (zeroing and merging its output) stay small. The cut depends only on
// the sequence's length, so results do not depend on the thread count or on the rest of the batch.
constexpr int64_t kMinUnitRows = 128;
constexpr int64_t kMaxUnitRows = 1024;
constexpr int64_t kUnitsPerSequence = 4;

struct Geometry {
  int64_t H;      // heads
  int64_t Hp;     // heads padded so that a vector holds whole (row, head-block) score groups
  int64_t R;      // latent values per row
  int64_t K;      // values per row: R + Dr
  int64_t Kp;     // K rounded up to whole vectors (the query operand's row length)
  int64_t Kw;     // K/2 pair words rounded up to whole vectors (the pair query's row length, ≤ Kp)
  int64_t period; // lcm(Hp, 16): the score buffer's head pattern repeats every `period` floats
  float scale;

  explicit Geometry(const LatentAttentionDims& d)
      : H(d.heads),
        Hp(d.heads <= 2 ? 2 : d.heads <= 4 ? 4 : d.heads <= 8 ? 8 : round_up(d.heads, 8)),
        R(d.latent),
        K(d.latent + d.rope),
        Kp(round_up(d.latent + d.rope, kLanes)),
        Kw(round_up(ceil_div(d.latent + d.rope, 2), kLanes)),
        period(std::lcm(Hp, int64_t(kLanes))),
        scale(d.scale) {}
  // Score blocks: HB heads × KB rows = one vector of scores.
  int64_t score_heads() const { return std::min<int64_t>(Hp, 8); }
  // bf16 products on blocks of 8 heads take score_block_halves, in steps of 8 pair words.
  bool halves(bool bf16_products) const { return bf16_products && Hp >= 8; }
  int64_t half_steps() const { return ceil_div(K / 2, 8); }
  // Scores, probability pairs (bf16 products), softmax work, running max, sum and rescale factors;
  // or, while queries are packed, one f32 row of a pair query and its pairs.
  size_t thread_floats() const {
    return size_t(std::max(kTile * Hp + kTile / 2 * Hp + 3 * period + 3 * Hp, 3 * Kw));
  }
  // Per sequence: the query operand, scale · q as f32 [Hp × Kp] or as pairs [Hp × Kw] (both zero
  // in padding heads and columns).
  size_t query_floats() const { return size_t(Hp * Kp); }
  size_t partial_floats() const { return size_t(H * R + 2 * H); }
};

inline Vec load_row(const float* p) { return load(p); }
inline Vec load_row(const float* p, Mask m) { return load(p, m); }
inline Vec load_row(const bf16* p) { return load_bf16(p); }
inline Vec load_row(const bf16* p, Mask m) { return load_bf16(p, m); }

// Asks for the `rows` rows from `at` to be brought into L1. Scores read a tile's rows for the first
// time; prefetching the next tile's rows meanwhile keeps the loads from waiting on memory (without
// it, `perf` put ~40% of the score time on the first loads of each row, for a cache in DRAM).
template <typename T>
inline void prefetch_rows(const T* at, int64_t rows, int64_t K) {
  const char* p = reinterpret_cast<const char*>(at);
  const int64_t bytes = rows * K * int64_t(sizeof(T));
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

// Scores of KB consecutive rows (rows past `valid` repeat the last valid one) against HB query
// rows, as one vector whose lane k·HB + h is q_h·row_k. Lanes run along the row's values, so each
// (row, head) dot product ends as a vector that sum_each reduces together with the other 15.
template <int KB, int HB, typename T>
Vec score_block(const T* rows, int64_t K, int64_t valid, const float* q, int64_t ldq) {
  static_assert(KB * HB == kLanes);
  const T* row[KB];
  unroll<KB>([&](auto k) { row[k] = rows + std::min<int64_t>(k, valid - 1) * K; });
  Vec acc[KB * HB];
  unroll<KB * HB>([&](auto i) { acc[i] = zero(); });
  auto step = [&](int64_t at, auto masked, Mask m) {
    Vec c[KB];
    unroll<KB>([&](auto k) {
      if constexpr (decltype(masked)::value) c[k] = load_row(row[k] + at, m);
      else c[k] = load_row(row[k] + at);
    });
    unroll<HB>([&](auto h) {
      const Vec qh = load(q + h * ldq + at);  // zero past K
      unroll<KB>([&](auto k) { acc[k * HB + h] = fmadd(c[k], qh, acc[k * HB + h]); });
    });
  };
  int64_t at = 0;
  for (; at + kLanes <= K; at += kLanes) step(at, std::false_type{}, kAll);
  if (at < K) step(at, std::true_type{}, lane_range(0, K - at));
  return sum_each(acc);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
#define HYLA_LATENT_AVX2 1

inline __m256 load_row8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_row8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// score_block on AVX2's 16 ymm registers: KB·HB = 8 single-register accumulators (16 two-register
// ones spill), lane k·HB + h of the result is q_h·row_k. The last step of a row whose length is not
// a multiple of 8 reads the row through a zero-padded copy (the query is zero past K).
template <int KB, int HB, typename T>
__m256 score_block8(const T* rows, int64_t K, int64_t valid, const float* q, int64_t ldq) {
  static_assert(KB * HB == 8);
  const T* row[KB];
  unroll<KB>([&](auto k) { row[k] = rows + std::min<int64_t>(k, valid - 1) * K; });
  __m256 acc[8];
  unroll<8>([&](auto i) { acc[i] = _mm256_setzero_ps(); });
  // Values at..at+8 of the rows, read from `from[k] + offset`.
  auto step = [&](int64_t at, const T* const* from, int64_t offset) {
    __m256 c[KB];
    unroll<KB>([&](auto k) { c[k] = load_row8(from[k] + offset); });
    unroll<HB>([&](auto h) {
      const __m256 qh = _mm256_loadu_ps(q + h * ldq + at);
      unroll<KB>([&](auto k) { acc[k * HB + h] = _mm256_fmadd_ps(c[k], qh, acc[k * HB + h]); });
    });
  };
  int64_t at = 0;
  for (; at + 8 <= K; at += 8) step(at, row, at);
  if (at < K) {
    T tail[KB][8] = {};
    const T* from[KB];
    unroll<KB>([&](auto k) {
      std::copy(row[k] + at, row[k] + K, tail[k]);
      from[k] = tail[k];
    });
    step(at, from, 0);
  }
  return vec::detail::sums_of_8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
}
#endif

// scores [nk_pad × Hp] for the tile's rows; returns nk_pad (nk rounded up to whole blocks), whose
// padding rows hold -inf.
template <int HB, typename T>
int64_t tile_scores(const Geometry& g, const T* tile, int64_t nk, const float* q, float* scores) {
  constexpr int KB = kLanes / HB;
  const int64_t nk_pad = round_up(nk, KB);
#if defined(HYLA_LATENT_AVX2)
  // Blocks of 8 scores; the padding the softmax's whole vectors need is filled with -inf below.
  constexpr int KB8 = 8 / HB;
  for (int64_t s = 0; s < nk; s += KB8) {
    prefetch_rows(tile + (kTile + s) * g.K, KB8, g.K);
    for (int64_t h0 = 0; h0 < g.Hp; h0 += HB) {
      const __m256 r = score_block8<KB8, HB>(tile + s * g.K, g.K, nk - s, q + h0 * g.Kp, g.Kp);
      if (HB == g.Hp) {
        alignas(32) float out[8];
        _mm256_store_ps(out, r);
        std::copy_n(out, std::min<int64_t>(8, (nk - s) * HB), scores + s * HB);
      } else {  // KB8 = 1: the row's 8 heads from h0
        _mm256_storeu_ps(scores + s * g.Hp + h0, r);
      }
    }
  }
#else
  for (int64_t s = 0; s < nk_pad; s += KB) {
    prefetch_rows(tile + (kTile + s) * g.K, KB, g.K);  // the next tile's rows (a hint: never faults)
    for (int64_t h0 = 0; h0 < g.Hp; h0 += HB) {
      const Vec r = score_block<KB, HB>(tile + s * g.K, g.K, nk - s, q + h0 * g.Kp, g.Kp);
      if (HB == g.Hp) {
        store(scores + s * HB, r);
      } else {  // row k's HB lanes go to its own row of the buffer
        unroll<KB>([&](auto k) {
          store(scores + (s + k) * g.Hp + h0 - k * HB, r, lane_range(k * HB, (k + 1) * HB));
        });
      }
    }
  }
#endif
  std::fill(scores + nk * g.Hp, scores + nk_pad * g.Hp, -std::numeric_limits<float>::infinity());
  return nk_pad;
}

// Online softmax over one tile of scores [nk_pad × Hp] (head h in column h): overwrites them
// with exp(score − m_new), updates the running max m and sum l per head and sets alpha to
// exp(m_old − m_new), the factor for the output accumulated so far. The buffer's vectors see
// heads in a pattern that repeats every g.period floats, so maxima and sums are taken lane-wise
// per pattern position and folded per head once per tile.
void softmax_tile(const Geometry& g, float* scores, int64_t nk_pad, float* m, float* l, float* alpha, float* work) {
  const int64_t P = g.period / kLanes, vectors = nk_pad * g.Hp / kLanes;
  float* column = work;               // [period] lane-wise max, then sum
  float* base = work + g.period;      // [period] the new max of each lane's head
  float* tile_max = base + g.period;  // [Hp]
  for (int64_t p = 0; p < P; ++p) {
    Vec mx[2] = {negative_infinity(), negative_infinity()};  // two chains: max's latency would bound one
    int64_t j = p;
    for (; j + P < vectors; j += 2 * P) {
      mx[0] = max(mx[0], load(scores + j * kLanes));
      mx[1] = max(mx[1], load(scores + (j + P) * kLanes));
    }
    if (j < vectors) mx[0] = max(mx[0], load(scores + j * kLanes));
    store(column + p * kLanes, max(mx[0], mx[1]));
  }
  // (Loops over pattern positions go f0 + h rather than f % Hp: a division per position would cost
  // more than the tile's exponentials.)
  std::fill(tile_max, tile_max + g.Hp, -std::numeric_limits<float>::infinity());
  for (int64_t f0 = 0; f0 < g.period; f0 += g.Hp)
    for (int64_t h = 0; h < g.Hp; ++h) tile_max[h] = std::max(tile_max[h], column[f0 + h]);
  for (int64_t h = 0; h < g.Hp; ++h) {
    const float m_new = std::max(m[h], tile_max[h]);
    // A head that has seen only -inf keeps max -inf; subtracting 0 instead keeps exp at 0, not NaN.
    const float shift = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
    alpha[h] = m[h] - shift;
    m[h] = m_new;
    tile_max[h] = shift;
  }
  exp_inplace(alpha, g.Hp);
  for (int64_t f0 = 0; f0 < g.period; f0 += g.Hp) std::copy(tile_max, tile_max + g.Hp, base + f0);
  for (int64_t p = 0; p < P; ++p) {
    const Vec b = load(base + p * kLanes);
    Vec sum = zero();
    for (int64_t j = p; j < vectors; j += P) {
      const Vec e = exp(load(scores + j * kLanes) - b);
      store(scores + j * kLanes, e);
      sum = sum + e;
    }
    store(column + p * kLanes, sum);
  }
  for (int64_t h = 0; h < g.Hp; ++h) l[h] *= alpha[h];
  for (int64_t f0 = 0; f0 < g.period; f0 += g.Hp)
    for (int64_t h = 0; h < g.Hp; ++h) l[h] += column[f0 + h];
}

// o[h, c0 .. c0 + 16V) = alpha[h]·o + Σ_{s < nk} p[s, h]·row_s for HB heads: HB × V accumulators
// (≤ 24 of the 32 vector registers) held over the tile's rows. The last vector is masked by tail.
template <int HB, int V, typename T>
void value_block(const T* tile, int64_t K, int64_t nk, const float* p, int64_t ldp, const float* alpha, float* o,
                 int64_t ldo, int64_t c0, Mask tail) {
  Vec acc[HB * V];
  unroll<HB>([&](auto h) {
    const Vec a = broadcast(alpha[h]);
    unroll<V>([&](auto v) {
      const float* x = o + h * ldo + c0 + v * kLanes;
      acc[h * V + v] = a * (v == V - 1 ? load(x, tail) : load(x));
    });
  });
  for (int64_t s = 0; s < nk; ++s) {
    const T* row = tile + s * K + c0;
    Vec c[V];
    unroll<V>([&](auto v) { c[v] = v == V - 1 ? load_row(row + v * kLanes, tail) : load_row(row + v * kLanes); });
    unroll<HB>([&](auto h) {
      const Vec ph = broadcast(p[s * ldp + h]);
      unroll<V>([&](auto v) { acc[h * V + v] = fmadd(ph, c[v], acc[h * V + v]); });
    });
  }
  unroll<HB>([&](auto h) {
    unroll<V>([&](auto v) {
      float* x = o + h * ldo + c0 + v * kLanes;
      if (v == V - 1) store(x, acc[h * V + v], tail);
      else store(x, acc[h * V + v]);
    });
  });
}

constexpr int kValueVectors = 4;
#if defined(HYLA_LATENT_AVX2)
// A Vec is two of AVX2's 16 ymm registers: HB·V ≤ 6 accumulators (12 registers) beside the row's
// V vectors; 6 heads × 16 values is the 6×16 register block of AVX2 GEMM kernels.
constexpr int kValueHeads = 6;
constexpr int max_value_vectors(int heads) { return heads <= 2 ? 3 : heads <= 3 ? 2 : 1; }
#else
constexpr int kValueHeads = 8;
constexpr int max_value_vectors(int heads) { return heads <= 6 ? 4 : 3; }  // HB·V ≤ 24
#endif

template <typename T>
using ValueFn = void (*)(const T*, int64_t, int64_t, const float*, int64_t, const float*, float*, int64_t, int64_t,
                         Mask);

template <typename T, int... I>
constexpr std::array<ValueFn<T>, sizeof...(I)> value_table(std::integer_sequence<int, I...>) {
  return {&value_block<I / kValueVectors + 1, I % kValueVectors + 1, T>...};
}

template <typename T>
void tile_values(const Geometry& g, const T* tile, int64_t nk, const float* p, const float* alpha, float* o) {
  static constexpr auto blocks = value_table<T>(std::make_integer_sequence<int, kValueHeads * kValueVectors>());
  for (int64_t h0 = 0; h0 < g.H; h0 += kValueHeads) {
    const int64_t heads = std::min<int64_t>(kValueHeads, g.H - h0);
    const int64_t chunk = max_value_vectors(int(heads)) * kLanes;
    for (int64_t c0 = 0; c0 < g.R; c0 += chunk) {
      const int64_t width = std::min(chunk, g.R - c0), vectors = ceil_div(width, kLanes);
      const Mask tail = lane_range(0, width - (vectors - 1) * kLanes);
      blocks[size_t((heads - 1) * kValueVectors + vectors - 1)](tile, g.K, nk, p + h0, g.Hp, alpha + h0, o + h0 * g.R,
                                                                g.R, c0, tail);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// bf16 products: a 32-bit word holds two bf16 (the first in the low half), and one vdpbf16ps adds
// a.lo·b.lo + a.hi·b.hi per lane in f32. Scores pair consecutive values of a row, exactly as the
// cache stores them; the value product pairs two consecutive rows, interleaved on the fly.

using Pair = uint32_t;

Pair to_pair(float lo, float hi) { return uint32_t(to_bf16(lo).bits) | uint32_t(to_bf16(hi).bits) << 16; }

#if defined(__AVX512F__)
using Words = __m512i;
inline Words load_words(const Pair* p) { return _mm512_loadu_si512(p); }
inline Words load_words(const Pair* p, Mask m) { return _mm512_maskz_loadu_epi32(m, p); }
inline Words broadcast_word(Pair w) { return _mm512_set1_epi32(int(w)); }
inline Words zero_words() { return _mm512_setzero_si512(); }
// Rows a and b, 32 values each: lo lane 4i + j pairs value 8i + j of a with that of b, hi lane
// 4i + j value 8i + 4 + j (unpack works within 128-bit lanes).
inline void interleave(Words a, Words b, Words& lo, Words& hi) {
  lo = _mm512_unpacklo_epi16(a, b);
  hi = _mm512_unpackhi_epi16(a, b);
}
// 8 words into both 256-bit halves (lanes past m's first 8 bits 0).
inline Words broadcast_half(const Pair* p) {
  return _mm512_broadcast_i32x8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Words broadcast_half(const Pair* p, Mask m) { return _mm512_broadcast_i32x8(_mm256_maskz_loadu_epi32(__mmask8(m), p)); }
#if defined(__AVX512BF16__)
inline Vec dot_pairs(Vec acc, Words a, Words b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
#else
inline Vec dot_pairs(Vec acc, Words a, Words b) {  // the same products as two f32 FMAs
  const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
  acc = fmadd(_mm512_castsi512_ps(_mm512_slli_epi32(a, 16)), _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)), acc);
  return fmadd(_mm512_castsi512_ps(_mm512_and_si512(a, high)), _mm512_castsi512_ps(_mm512_and_si512(b, high)), acc);
}
#endif
#else
struct Words {
  Pair w[kLanes];
};
inline Words load_words(const Pair* p, Mask m = kAll) {
  Words r;
  for (int i = 0; i < kLanes; ++i) r.w[i] = (m >> i) & 1 ? p[i] : 0u;
  return r;
}
inline Words broadcast_word(Pair w) {
  Words r;
  for (Pair& x : r.w) x = w;
  return r;
}
inline Words zero_words() { return broadcast_word(0u); }
inline Words broadcast_half(const Pair* p, Mask m = 0xff) {
  Words r;
  for (int i = 0; i < kLanes; ++i) r.w[i] = (m >> (i % 8)) & 1 ? p[i % 8] : 0u;
  return r;
}
inline void interleave(Words a, Words b, Words& lo, Words& hi) {
  auto half = [](const Words& x, int k) { return uint16_t(x.w[k / 2] >> (16 * (k % 2))); };
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      lo.w[4 * i + j] = half(a, 8 * i + j) | uint32_t(half(b, 8 * i + j)) << 16;
      hi.w[4 * i + j] = half(a, 8 * i + 4 + j) | uint32_t(half(b, 8 * i + 4 + j)) << 16;
    }
}
inline Vec dot_pairs(Vec acc, Words a, Words b) {
  Vec alo, ahi, blo, bhi;
  load_bf16_pairs(a.w, kAll, alo, ahi);
  load_bf16_pairs(b.w, kAll, blo, bhi);
  return fmadd(ahi, bhi, fmadd(alo, blo, acc));
}
#endif

// score_block with pairs: rows of K values are K/2 words (K even).
template <int KB, int HB>
Vec score_block_pairs(const bf16* rows, int64_t K, int64_t valid, const Pair* q, int64_t ldq) {
  static_assert(KB * HB == kLanes);
  const Pair* row[KB];
  unroll<KB>([&](auto k) { row[k] = reinterpret_cast<const Pair*>(rows + std::min<int64_t>(k, valid - 1) * K); });
  Vec acc[KB * HB];
  unroll<KB * HB>([&](auto i) { acc[i] = zero(); });
  auto step = [&](int64_t at, auto masked, Mask m) {
    Words c[KB];
    unroll<KB>([&](auto k) {
      if constexpr (decltype(masked)::value) c[k] = load_words(row[k] + at, m);
      else c[k] = load_words(row[k] + at);
    });
    unroll<HB>([&](auto h) {
      const Words qh = load_words(q + h * ldq + at);  // zero past K/2
      unroll<KB>([&](auto k) { acc[k * HB + h] = dot_pairs(acc[k * HB + h], c[k], qh); });
    });
  };
  const int64_t words = K / 2;
  int64_t at = 0;
  for (; at + kLanes <= words; at += kLanes) step(at, std::false_type{}, kAll);
  if (at < words) step(at, std::true_type{}, lane_range(0, words - at));
  return sum_each(acc);
}

template <int HB>
int64_t tile_scores_pairs(const Geometry& g, const bf16* tile, int64_t nk, const Pair* q, float* scores) {
  constexpr int KB = kLanes / HB;
  const int64_t nk_pad = round_up(nk, KB), ldq = g.Kw;
  for (int64_t s = 0; s < nk_pad; s += KB) {
    prefetch_rows(tile + (kTile + s) * g.K, KB, g.K);
    for (int64_t h0 = 0; h0 < g.Hp; h0 += HB) {
      const Vec r = score_block_pairs<KB, HB>(tile + s * g.K, g.K, nk - s, q + h0 * ldq, ldq);
      if (HB == g.Hp) {
        store(scores + s * HB, r);
      } else {
        unroll<KB>([&](auto k) {
          store(scores + (s + k) * g.Hp + h0 - k * HB, r, lane_range(k * HB, (k + 1) * HB));
        });
      }
    }
  }
  std::fill(scores + nk * g.Hp, scores + nk_pad * g.Hp, -std::numeric_limits<float>::infinity());
  return nk_pad;
}

// Scores of 4 rows against a block of 8 heads, as two vectors (rows 0-1, then 2-3) with lane
// k·8 + h. An accumulator holds two heads, one per 256-bit half (heads b and b + 4 against the
// same row, broadcast to both halves), so 32 dot products end in 16 vectors that two sum_halves
// reduce: half the shuffles of sum_each on one dot product per vector, which otherwise cost about
// as much as the products. q: per head pair b and step t, 16 words (8 of head b, 8 of head b + 4).
void score_block_halves(const bf16* rows, int64_t K, int64_t valid, const Pair* q, int64_t steps, Vec out[2]) {
  constexpr int KB = 4;
  const Pair* row[KB];
  unroll<KB>([&](auto k) { row[k] = reinterpret_cast<const Pair*>(rows + std::min<int64_t>(k, valid - 1) * K); });
  Vec acc[16];
  unroll<16>([&](auto i) { acc[i] = zero(); });
  const int64_t words = K / 2;
  auto step = [&](int64_t t, auto masked) {
    Words r[KB];
    unroll<KB>([&](auto k) {
      if constexpr (decltype(masked)::value) r[k] = broadcast_half(row[k] + 8 * t, lane_range(0, words - 8 * t));
      else r[k] = broadcast_half(row[k] + 8 * t);
    });
    unroll<4>([&](auto b) {
      const Words qb = load_words(q + (b * steps + t) * kLanes);
      unroll<KB>([&](auto k) {  // sum_halves' layout: w[2b + c] for row c of a pair
        constexpr int i = (k / 2) * 8 + 2 * b + k % 2;
        acc[i] = dot_pairs(acc[i], r[k], qb);
      });
    });
  };
  int64_t t = 0;
  for (; 8 * (t + 1) <= words; ++t) step(t, std::false_type{});
  if (8 * t < words) step(t, std::true_type{});
  out[0] = sum_halves(acc);
  out[1] = sum_halves(acc + 8);
}

int64_t tile_scores_halves(const Geometry& g, const bf16* tile, int64_t nk, const Pair* q, float* scores) {
  const int64_t nk_pad = round_up(nk, 4), steps = g.half_steps(), block = 8 * steps * 8;  // words per head block
  for (int64_t s = 0; s < nk_pad; s += 4) {
    prefetch_rows(tile + (kTile + s) * g.K, 4, g.K);
    for (int64_t h0 = 0; h0 < g.Hp; h0 += 8) {
      Vec out[2];
      score_block_halves(tile + s * g.K, g.K, nk - s, q + h0 / 8 * block, steps, out);
      for (int64_t pair = 0; pair < 2; ++pair) {
        float* first = scores + (s + 2 * pair) * g.Hp + h0;
        if (g.Hp == 8) {
          store(first, out[pair]);
        } else {
          store(first, out[pair], 0x00ff);
          store(first + g.Hp - 8, out[pair], 0xff00);
        }
      }
    }
  }
  std::fill(scores + nk * g.Hp, scores + nk_pad * g.Hp, -std::numeric_limits<float>::infinity());
  return nk_pad;
}

// o[h, segment] += Σ_t pair(p[2t, h], p[2t+1, h]) · interleave(row 2t, row 2t+1) for HB heads and
// V segments of 32 values from c0, after o ← alpha[h]·o. o holds each segment permuted as
// interleave delivers it (16 "lo" lanes, then 16 "hi" lanes); run_unit puts it in order at the end.
template <int HB, int V>
void value_block_pairs(const bf16* tile, int64_t K, int64_t nk, const Pair* p, int64_t ldp, const float* alpha,
                       float* o, int64_t ldo, int64_t c0) {
  Vec acc[HB * V * 2];
  unroll<HB>([&](auto h) {
    const Vec a = broadcast(alpha[h]);
    unroll<V * 2>([&](auto i) { acc[h * V * 2 + i] = a * load(o + h * ldo + c0 + i * kLanes); });
  });
  auto step = [&](int64_t t, auto second_row) {
    const bf16* first = tile + 2 * t * K + c0;
    Words lo[V], hi[V];
    unroll<V>([&](auto v) {
      const Words a = load_words(reinterpret_cast<const Pair*>(first + v * 2 * kLanes));
      Words b = zero_words();  // the tile's last row, when nk is odd, pairs with zeros
      if constexpr (decltype(second_row)::value) b = load_words(reinterpret_cast<const Pair*>(first + K + v * 2 * kLanes));
      interleave(a, b, lo[v], hi[v]);
    });
    unroll<HB>([&](auto h) {
      const Words w = broadcast_word(p[t * ldp + h]);
      unroll<V>([&](auto v) {
        acc[h * V * 2 + 2 * v] = dot_pairs(acc[h * V * 2 + 2 * v], lo[v], w);
        acc[h * V * 2 + 2 * v + 1] = dot_pairs(acc[h * V * 2 + 2 * v + 1], hi[v], w);
      });
    });
  };
  int64_t t = 0;
  for (; 2 * t + 1 < nk; ++t) step(t, std::true_type{});
  if (2 * t < nk) step(t, std::false_type{});
  unroll<HB>([&](auto h) { unroll<V * 2>([&](auto i) { store(o + h * ldo + c0 + i * kLanes, acc[h * V * 2 + i]); }); });
}

constexpr int kPairSegments = 2;  // 32-value segments per value block: HB·2·V ≤ 24 accumulators
constexpr int max_pair_segments(int heads) { return heads <= 6 ? 2 : 1; }

using PairValueFn = void (*)(const bf16*, int64_t, int64_t, const Pair*, int64_t, const float*, float*, int64_t,
                             int64_t);

template <int... I>
constexpr std::array<PairValueFn, sizeof...(I)> pair_value_table(std::integer_sequence<int, I...>) {
  return {&value_block_pairs<I / kPairSegments + 1, I % kPairSegments + 1>...};
}

void tile_values_pairs(const Geometry& g, const bf16* tile, int64_t nk, const Pair* p, const float* alpha, float* o) {
  static constexpr auto blocks = pair_value_table(std::make_integer_sequence<int, kValueHeads * kPairSegments>());
  constexpr int64_t kSegment = 2 * kLanes;
  for (int64_t h0 = 0; h0 < g.H; h0 += kValueHeads) {
    const int64_t heads = std::min<int64_t>(kValueHeads, g.H - h0);
    const int64_t chunk = max_pair_segments(int(heads)) * kSegment;
    for (int64_t c0 = 0; c0 < g.R; c0 += chunk) {
      const int64_t segments = std::min(chunk, g.R - c0) / kSegment;
      blocks[size_t((heads - 1) * kPairSegments + segments - 1)](tile, g.K, nk, p + h0, g.Hp, alpha + h0,
                                                                 o + h0 * g.R, g.R, c0);
    }
  }
}

// The probabilities of rows 2t and 2t+1 as one pair per head: out[t, h] (nk_pad even). Rounded
// to bf16 in vectors: one scalar conversion per value would cost a fifth of the kernel's time.
void pair_probabilities(const float* p, int64_t nk_pad, int64_t Hp, Pair* out) {
  for (int64_t t = 0; 2 * t < nk_pad; ++t) {
    const float* lo = p + 2 * t * Hp;
    const float* hi = lo + Hp;
    Pair* dst = out + t * Hp;
    int64_t h = 0;
#if defined(__AVX512BF16__)
    // vcvtne2ps2bf16 puts lo's values in the low 16 halves and hi's in the high 16; vpermw
    // interleaves them into pairs.
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (; h < Hp; h += kLanes) {
      const Mask m = lane_range(0, Hp - h);
      const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(load(hi + h, m), load(lo + h, m));
      _mm512_mask_storeu_epi32(dst + h, m, _mm512_permutexvar_epi16(interleave, halves));
    }
#endif
    for (; h < Hp; ++h) dst[h] = to_pair(lo[h], hi[h]);
  }
}

// Undoes interleave's order in each 32-value segment of an output row.
void order_segments(float* row, int64_t R) {
  float tmp[2 * kLanes];
  for (int64_t c0 = 0; c0 < R; c0 += 2 * kLanes) {
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        tmp[8 * i + j] = row[c0 + 4 * i + j];
        tmp[8 * i + 4 + j] = row[c0 + kLanes + 4 * i + j];
      }
    std::copy(tmp, tmp + 2 * kLanes, row + c0);
  }
}

// Row h of a sequence's query operand: scale · q_h, zero past K and in padding heads. As pairs
// (consecutive bf16, i.e. a bf16 row of 2·Kw values) for bf16 products, staged in `buffer`; in
// score_block_halves' layout when `halves`.
void pack_query_row(const Geometry& g, bool pairs, bool halves, const float* q, int64_t h, float* op, float* buffer) {
  const int64_t width = pairs ? 2 * g.Kw : g.Kp;
  float* values = pairs ? buffer : op + h * g.Kp;
  for (int64_t k = 0; k < width; ++k) values[k] = h < g.H && k < g.K ? g.scale * q[h * g.K + k] : 0.0f;
  if (!pairs) return;
  if (!halves) {
    convert(values, reinterpret_cast<bf16*>(op) + h * 2 * g.Kw, size_t(width));
    return;
  }
  const int64_t steps = g.half_steps(), b = h % 4, half = h % 8 / 4;
  Pair* block = reinterpret_cast<Pair*>(op) + h / 8 * 8 * steps * 8;
  Pair* words = reinterpret_cast<Pair*>(buffer + width);
  convert(values, reinterpret_cast<bf16*>(words), size_t(2 * steps * 8));
  for (int64_t t = 0; t < steps; ++t) std::copy_n(words + 8 * t, 8, block + (b * steps + t) * kLanes + 8 * half);
}

// One unit: rows [begin, end) of one cache against that sequence's query. Writes the unnormalised
// output [H, R], then the running max [H] and sum [H], to `partial`. kPairs: bf16 products (T is
// bf16).
template <bool kPairs, typename T>
void run_unit(const Geometry& g, const T* rows, int64_t begin, int64_t end, const float* q_op, float* partial,
              float* buffer) {
  float* scores = buffer;                                          // [kTile × Hp]
  Pair* p_pairs = reinterpret_cast<Pair*>(scores + kTile * g.Hp);  // [kTile/2 × Hp]
  float* work = scores + kTile * g.Hp + kTile / 2 * g.Hp;          // [3 · period]
  float* m = work + 3 * g.period;                                  // [Hp] running max
  float* l = m + g.Hp;                                             // [Hp] running sum
  float* alpha = l + g.Hp;                                         // [Hp]
  const Pair* q_pairs = reinterpret_cast<const Pair*>(q_op);
  float* o = partial;
  std::fill(o, o + g.H * g.R, 0.0f);
  std::fill(m, m + g.Hp, -std::numeric_limits<float>::infinity());
  std::fill(l, l + g.Hp, 0.0f);
  for (int64_t t0 = begin; t0 < end; t0 += kTile) {
    const int64_t nk = std::min(kTile, end - t0);
    const T* tile = rows + t0 * g.K;
    int64_t nk_pad = 0;
    if constexpr (kPairs) {
      switch (g.score_heads()) {
        case 2: nk_pad = tile_scores_pairs<2>(g, tile, nk, q_pairs, scores); break;
        case 4: nk_pad = tile_scores_pairs<4>(g, tile, nk, q_pairs, scores); break;
        default: nk_pad = tile_scores_halves(g, tile, nk, q_pairs, scores); break;
      }
      softmax_tile(g, scores, nk_pad, m, l, alpha, work);
      pair_probabilities(scores, nk_pad, g.Hp, p_pairs);
      tile_values_pairs(g, tile, nk, p_pairs, alpha, o);
    } else {
      switch (g.score_heads()) {
        case 2: nk_pad = tile_scores<2>(g, tile, nk, q_op, scores); break;
        case 4: nk_pad = tile_scores<4>(g, tile, nk, q_op, scores); break;
        default: nk_pad = tile_scores<8>(g, tile, nk, q_op, scores); break;
      }
      softmax_tile(g, scores, nk_pad, m, l, alpha, work);
      tile_values(g, tile, nk, scores, alpha, o);
    }
  }
  if constexpr (kPairs)
    for (int64_t h = 0; h < g.H; ++h) order_segments(o + h * g.R, g.R);
  std::copy(m, m + g.H, partial + g.H * g.R);
  std::copy(l, l + g.H, partial + g.H * g.R + g.H);
}

}  // namespace

void latent_attention_decode(const LatentAttentionDims& d, int64_t batch, const LatentCacheRows* caches,
                             const float* q, float* o, Workspace& workspace) {
  HYLA_CHECK(d.heads > 0 && d.latent > 0 && d.rope >= 0 && d.window >= 0,
             "latent attention: need heads, latent > 0 and rope, window >= 0, got {}, {}, {}, {}", d.heads, d.latent,
             d.rope, d.window);
  HYLA_CHECK(batch >= 0, "latent attention: negative batch {}", batch);
  const bool bf16_rows = batch > 0 && caches[0].rows_bf16 != nullptr;
  HYLA_CHECK(!d.bf16_products || batch == 0 || (bf16_rows && d.latent % 32 == 0),
             "latent attention: bf16 products need bf16 rows and a latent width that is a multiple of 32, got {} "
             "rows of latent width {}", bf16_rows ? "bf16" : "f32", d.latent);
  for (int64_t b = 0; b < batch; ++b) {
    const LatentCacheRows& c = caches[b];
    HYLA_CHECK((c.rows_bf16 != nullptr) != (c.rows_f32 != nullptr),
               "latent attention: cache {} needs exactly one of its bf16 and f32 rows", b);
    HYLA_CHECK((c.rows_bf16 != nullptr) == bf16_rows, "latent attention: cache {} has another dtype than cache 0", b);
    HYLA_CHECK(c.length >= 0, "latent attention: cache {} has negative length {}", b, c.length);
  }
  const Geometry g(d);
  // bf16 products run on AMX tiles where the CPU has them (latent_attention_amx.h), else on
  // vectors; the two take the same units and write the same partial results.
  const bool tiles = d.bf16_products && latent_amx::usable(g.H, g.R, g.K);
  const int64_t tile_floats = tiles ? ceil_div(int64_t(latent_amx::thread_bytes(g.H, g.R, g.K, kMaxUnitRows)), 4) : 0;
  const int64_t thread_floats = std::max(int64_t(g.thread_floats()), tile_floats);
  const int64_t query_floats =
      std::max(int64_t(g.query_floats()), tiles ? int64_t(latent_amx::query_words(g.H, g.K)) : 0);
  workspace.reserve();
  Frame frame(workspace.serial());
  // Each sequence's visible rows in pieces: sequence b's units are [first_unit[b], first_unit[b + 1]).
  auto piece_rows = [&](int64_t rows) {
    return std::clamp(round_up(ceil_div(rows, kUnitsPerSequence), kTile), kMinUnitRows, kMaxUnitRows);
  };
  auto visible_from = [&](int64_t length) { return d.window ? std::max<int64_t>(0, length - d.window) : 0; };
  int64_t units = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t rows = caches[b].length - visible_from(caches[b].length);
    if (rows > 0) units += ceil_div(rows, piece_rows(rows));
  }
  Unit* const unit_list = frame.take<Unit>(units);
  int64_t* const first_unit = frame.take<int64_t>(batch + 1);
  units = 0;
  for (int64_t b = 0; b < batch; ++b) {
    first_unit[b] = units;
    const int64_t length = caches[b].length, first = visible_from(length), rows = length - first;
    if (rows == 0) continue;
    const int64_t piece = piece_rows(rows);
    for (int64_t begin = first; begin < length; begin += piece) unit_list[units++] = {b, begin, std::min(length, begin + piece)};
  }
  first_unit[batch] = units;
  float* const partials = frame.take<float>(units * int64_t(g.partial_floats()));
  float* const queries = frame.take<float>(batch * query_floats);
  const int64_t ldq = g.H * g.K;

  if (tiles) {
    for (int64_t b = 0; b < batch; ++b)
      latent_amx::pack_query(g.H, g.K, g.scale, q + b * ldq, reinterpret_cast<uint32_t*>(queries + b * query_floats));
  } else {
    const int64_t query_rows = batch * g.Hp;
    parallel_for(query_rows, units > 1 ? 1 : query_rows, [&](int thread, int64_t first, int64_t last) {
      Frame thread_frame(workspace.thread(thread));
      float* buffer = thread_frame.take<float>(thread_floats);
      for (int64_t bh = first; bh < last; ++bh)
        pack_query_row(g, d.bf16_products, g.halves(d.bf16_products), q + bh / g.Hp * ldq, bh % g.Hp,
                       queries + bh / g.Hp * query_floats, buffer);
    });
  }
  parallel_for(units, 1, [&](int thread, int64_t first, int64_t last) {
    Frame thread_frame(workspace.thread(thread));
    float* buffer = thread_frame.take<float>(thread_floats);
    for (int64_t u = first; u < last; ++u) {
      const Unit& unit = unit_list[u];
      float* partial = partials + u * int64_t(g.partial_floats());
      const LatentCacheRows& c = caches[unit.seq];
      const float* q_op = queries + unit.seq * query_floats;
      if (tiles)
        latent_amx::run_unit(g.H, g.R, g.K, c.rows_bf16, unit.begin, unit.end, reinterpret_cast<const uint32_t*>(q_op),
                             partial, buffer);
      else if (d.bf16_products) run_unit<true>(g, c.rows_bf16, unit.begin, unit.end, q_op, partial, buffer);
      else if (bf16_rows) run_unit<false>(g, c.rows_bf16, unit.begin, unit.end, q_op, partial, buffer);
      else run_unit<false>(g, c.rows_f32, unit.begin, unit.end, q_op, partial, buffer);
    }
  });

  // Merge each (sequence, head)'s pieces by their log-sum-exp, in unit order.
  const int64_t stride = int64_t(g.partial_floats());
  const int64_t heads = batch * g.H;
  parallel_for(heads, heads > 8 ? 1 : heads, [&](int, int64_t first, int64_t last) {
  for (int64_t bh = first; bh < last; ++bh) {
    const int64_t b = bh / g.H, h = bh % g.H;
    const int64_t u0 = first_unit[b], u1 = first_unit[b + 1];
    float* out = o + bh * g.R;
    std::fill(out, out + g.R, 0.0f);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t u = u0; u < u1; ++u) m = std::max(m, partials[u * stride + g.H * g.R + h]);
    if (m == -std::numeric_limits<float>::infinity()) continue;  // no visible row (or only -inf scores)
    float total = 0.0f;
    for (int64_t u = u0; u < u1; ++u) {
      const float* part = partials + u * stride;
      const float w = std::exp(part[g.H * g.R + h] - m);
      total += w * part[g.H * g.R + g.H + h];
      const float* po = part + h * g.R;
#pragma omp simd
      for (int64_t r = 0; r < g.R; ++r) out[r] += w * po[r];
    }
    const float inv = 1.0f / total;
#pragma omp simd
    for (int64_t r = 0; r < g.R; ++r) out[r] *= inv;
  }
  });
}

bool latent_attention_use_bf16_products(int64_t latent, bool bf16_rows, bool allowed) {
  return allowed && bf16_rows && latent % 32 == 0 && native_bf16_products();
}

}  // namespace hyla
