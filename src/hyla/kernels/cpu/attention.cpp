#include "hyla/kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <span>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/half.h"
#include "hyla/core/memory.h"
#include "hyla/kernels/cpu/instruction_set.h"
#include "hyla/kernels/cpu/amx_tiles.h"
#include "hyla/kernels/cpu/vec.h"

namespace hyla {

using namespace vec;

namespace {

// One unit of parallel work. Forward: query tile `begin` of one (sequence, head); `group_cost` is
// the cost of the whole sequence. Backward: key tiles [begin, end) of one (sequence, head);
// `partial` is -1 when the unit accumulates dq straight into the output, else the offset (in
// floats) of its own dq buffer in the shared scratch memory.
struct Unit {
  int64_t seq, head, begin, end, cost, group_cost, partial;
};


// Tiles: 64 queries (4 vectors: queries run along the vector lanes) by 64 keys. Small enough that a
// tile's scores, a query tile's packed Q and the output accumulator stay in L1/L2.
constexpr int64_t kTileQ = 64;
constexpr int64_t kTileK = 64;

// ---------------------------------------------------------------------------------------------
// Tile products. Every product in the forward and backward pass has the form
//   C[r, :] (op)= Σ_k A(r, k) · B[k, :]
// where B's rows are contiguous (they become vectors) and A's elements are broadcast one at a time.
// Keeping scores transposed (keys in rows, queries along the vector lanes) makes every operand
// either a row of q/k/v/dO as it lies in memory or a packed tile, so K and V are never repacked,
// and the softmax max and sums over keys are lane-wise (no horizontal reductions).

enum class Out { Set, Add, Rescale };  // C = A·B, C += A·B, C = row_scale[r]·C + A·B

// Operand formats. F32: one value per k step, one FMA per k. BF16Pairs (the forward pass with
// AttentionDims::bf16_products): a 32-bit word holds two consecutive k values as bf16 (the first in
// the low half), and one vdpbf16ps per word computes acc += a.lo·b.lo + a.hi·b.hi in f32: twice
// the FLOPs of an FMA per instruction.
struct F32 {
  using Elem = float;
  using Operand = Vec;
  static Operand load(const float* p) { return vec::load(p); }
  static Operand load(const float* p, Mask m) { return vec::load(p, m); }
  static Operand broadcast(float a) { return vec::broadcast(a); }
  static Vec madd(Vec acc, Operand a, Operand b) { return fmadd(a, b, acc); }
  static int64_t steps(int64_t k) { return k; }  // k steps that hold k values
};

using Pair = uint32_t;

Pair to_pair(float lo, float hi) { return uint32_t(to_bf16(lo).bits) | uint32_t(to_bf16(hi).bits) << 16; }

struct BF16Pairs {
  using Elem = Pair;
#if defined(__AVX512BF16__)
  using Operand = __m512bh;
  static Operand load(const Pair* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static Operand load(const Pair* p, Mask m) { return (__m512bh)_mm512_maskz_loadu_epi32(m, p); }
  static Operand broadcast(Pair a) { return (__m512bh)_mm512_set1_epi32(int(a)); }
  static Vec madd(Vec acc, Operand a, Operand b) { return _mm512_dpbf16_ps(acc, a, b); }
#else
  // Without AVX512_BF16: each half as an f32 vector, two FMAs (the same products, rounded twice).
  struct Operand {
    Vec lo, hi;
  };
  static Operand load(const Pair* p, Mask m = kAll) {
    Operand o;
    load_bf16_pairs(p, m, o.lo, o.hi);
    return o;
  }
  static Operand broadcast(Pair a) {
    return {vec::broadcast(std::bit_cast<float>(a << 16)), vec::broadcast(std::bit_cast<float>(a & 0xffff0000u))};
  }
  static Vec madd(Vec acc, Operand a, Operand b) { return fmadd(a.hi, b.hi, fmadd(a.lo, b.lo, acc)); }
#endif
  static int64_t steps(int64_t k) { return (k + 1) / 2; }
};

// Register blocks: 6 rows × 4 vectors = 24 accumulators + 4 B vectors ≤ 32 zmm.
template <class Ops>
constexpr int kBlockRows = 6;
template <class Ops>
constexpr int kBlockVecs = 4;
#if defined(__AVX2__) && !defined(__AVX512F__)
// AVX2 has 16 ymm registers and a Vec is two of them: 6 rows × 1 vector = 12 accumulators beside
// the B vector and a broadcast (AVX2 GEMM's 6×16 block), 1.8× the 6 × 4 block, which spills.
// (BF16Pairs, whose emulated broadcast costs more than the spills, keeps 6 × 4: the model runs it
// only where AVX512_BF16 exists.)
template <>
constexpr int kBlockVecs<F32> = 1;
#endif

// R rows × V vectors of C over K steps. A(r, k) is a[r*lda + k], or a[k*lda + r] when kAT
// (A transposed). The last vector of each B row and C row is masked by `tail`.
template <class Ops, bool kAT, Out kOut, int R, int V>
void product_block(int64_t K, const typename Ops::Elem* a, int64_t lda, const typename Ops::Elem* b, int64_t ldb,
                   Mask tail, float* c, int64_t ldc, const float* row_scale) {
  Vec acc[R][V];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      if constexpr (kOut == Out::Set) {
        acc[r][v] = zero();
      } else {
        const Vec x = v == V - 1 ? load(c + r * ldc + v * kLanes, tail) : load(c + r * ldc + v * kLanes);
        acc[r][v] = kOut == Out::Add ? x : x * broadcast(row_scale[r]);
      }
    }
  for (int64_t k = 0; k < K; ++k) {
    const typename Ops::Elem* bk = b + k * ldb;
    typename Ops::Operand bv[V];
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) bv[v] = v == V - 1 ? Ops::load(bk + v * kLanes, tail) : Ops::load(bk + v * kLanes);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename Ops::Operand ar = Ops::broadcast(kAT ? a[k * lda + r] : a[r * lda + k]);
      #pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[r][v] = Ops::madd(acc[r][v], ar, bv[v]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      if (v == V - 1) store(c + r * ldc + v * kLanes, acc[r][v], tail);
      else store(c + r * ldc + v * kLanes, acc[r][v]);
    }
}

template <class Ops>
using BlockFn = void (*)(int64_t, const typename Ops::Elem*, int64_t, const typename Ops::Elem*, int64_t, Mask,
                         float*, int64_t, const float*);

template <class Ops, bool kAT, Out kOut, int... I>
constexpr std::array<BlockFn<Ops>, sizeof...(I)> block_table(std::integer_sequence<int, I...>) {
  return {&product_block<Ops, kAT, kOut, I / kBlockVecs<Ops> + 1, I % kBlockVecs<Ops> + 1>...};
}

// C [M × N] (op)= A [M × K] · B [K × N] (K in steps of Ops), register block by register block.
// Column chunks are the outer loop so a chunk of B (K × 64 values) stays in L1 while every row
// block streams over it.
template <class Ops, bool kAT, Out kOut>
void product(int64_t M, int64_t N, int64_t K, const typename Ops::Elem* a, int64_t lda, const typename Ops::Elem* b,
             int64_t ldb, float* c, int64_t ldc, const float* row_scale = nullptr) {
  static constexpr auto blocks =
      block_table<Ops, kAT, kOut>(std::make_integer_sequence<int, kBlockRows<Ops> * kBlockVecs<Ops>>());
  constexpr int64_t kChunk = kBlockVecs<Ops> * kLanes;
  for (int64_t n0 = 0; n0 < N; n0 += kChunk) {
    const int64_t width = std::min(kChunk, N - n0), vecs = ceil_div(width, kLanes);
    const Mask tail = lane_range(0, width - (vecs - 1) * kLanes);
    for (int64_t m0 = 0; m0 < M; m0 += kBlockRows<Ops>) {
      const int64_t rows = std::min<int64_t>(kBlockRows<Ops>, M - m0);
      blocks[size_t((rows - 1) * kBlockVecs<Ops> + vecs - 1)](K, kAT ? a + m0 : a + m0 * lda, lda, b + n0, ldb, tail,
                                                         c + m0 * ldc + n0, ldc, row_scale ? row_scale + m0 : nullptr);
    }
  }
}

// out[d*ld + i] = scale · x[i*ldx + d] for i < rows, d < cols; columns rows..ld-1 of out are 0.
void pack_transposed(const float* x, int64_t ldx, int64_t rows, int64_t cols, float scale, float* out, int64_t ld) {
  for (int64_t d = 0; d < cols; ++d) std::memset(out + d * ld + rows, 0, size_t(ld - rows) * sizeof(float));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = 0; d < cols; ++d) out[d * ld + i] = scale * x[i * ldx + d];
}

// out[i] = (lo[i], hi[i]) rounded to bf16, for i < n; hi == nullptr pairs with 0.
void pack_pairs(const float* lo, const float* hi, int64_t n, Pair* out) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  // vcvtne2ps2bf16 puts lo in the low 16 halves and hi in the high 16; vpermw interleaves them.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                              22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (; i + kLanes <= n; i += kLanes) {
    const __m512 h = hi ? _mm512_loadu_ps(hi + i) : _mm512_setzero_ps();
    const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(h, _mm512_loadu_ps(lo + i));
    _mm512_storeu_si512(out + i, _mm512_permutexvar_epi16(interleave, halves));
  }
#endif
  for (; i < n; ++i) out[i] = to_pair(lo[i], hi ? hi[i] : 0.0f);
}

// out[p] = (x[2p], x[2p+1]) rounded to bf16 for 2p < n; an odd last value pairs with 0.
void pack_consecutive_pairs(const float* x, int64_t n, Pair* out) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  // 32 values become 32 consecutive bf16, i.e. 16 pairs in order.
  for (; i + 2 * kLanes <= n; i += 2 * kLanes)
    _mm512_storeu_si512(out + i / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + kLanes), _mm512_loadu_ps(x + i)));
#endif
  for (; i < n; i += 2) out[i / 2] = to_pair(x[i], i + 1 < n ? x[i + 1] : 0.0f);
}

// Q operand of the bf16 score product: out[p*ld + i] = pairs (2p, 2p+1) of scale · x row i, for
// i < rows <= kTileQ; columns rows..ld-1 are 0. An odd last element pairs with 0. Each pair of
// columns is gathered into two rows first so the rounding and interleaving are vectorised.
void pack_query_pairs(const float* x, int64_t ldx, int64_t rows, int64_t cols, float scale, Pair* out, int64_t ld) {
  float lo[kTileQ], hi[kTileQ];
  for (int64_t p = 0; p < BF16Pairs::steps(cols); ++p) {
    for (int64_t i = 0; i < ld; ++i) {
      lo[i] = i < rows ? scale * x[i * ldx + 2 * p] : 0.0f;
      hi[i] = i < rows && 2 * p + 1 < cols ? scale * x[i * ldx + 2 * p + 1] : 0.0f;
    }
    pack_pairs(lo, hi, ld, out + p * ld);
  }
}

// ---------------------------------------------------------------------------------------------
// Geometry: which keys a tile of queries sees.

struct Sequence {
  int64_t q_begin, q_len, k_begin, kv_len;
  int64_t offset() const { return kv_len - q_len; }  // position of query 0
};

Sequence sequence(int64_t b, const int64_t* q_starts, const int64_t* k_starts) {
  return {q_starts[b], q_starts[b + 1] - q_starts[b], k_starts[b], k_starts[b + 1] - k_starts[b]};
}

struct Range {
  int64_t first, last;  // inclusive tile indices; empty when last < first
};

// Key tiles holding a key that some query at positions [p_lo, p_hi] sees.
Range key_tiles(const Sequence& s, int64_t p_lo, int64_t p_hi, const AttentionDims& d) {
  const int64_t lo = d.causal && d.window ? std::max<int64_t>(0, p_lo - d.window + 1) : 0;
  const int64_t hi = d.causal ? std::min(s.kv_len - 1, p_hi) : s.kv_len - 1;
  if (hi < lo) return {0, -1};
  return {lo / kTileK, hi / kTileK};
}

// Query tiles holding a query that sees some key in [k_lo, k_hi].
Range query_tiles(const Sequence& s, int64_t k_lo, int64_t k_hi, const AttentionDims& d) {
  if (!d.causal) return s.q_len > 0 ? Range{0, (s.q_len - 1) / kTileQ} : Range{0, -1};
  const int64_t lo = std::max<int64_t>(0, k_lo - s.offset());
  const int64_t hi = d.window ? std::min(s.q_len - 1, k_hi + d.window - 1 - s.offset()) : s.q_len - 1;
  if (hi < lo) return {0, -1};
  return {lo / kTileQ, hi / kTileQ};
}

enum class Visibility { None, All, Some };

// How the queries at positions [p_lo, p_hi] see the keys [k_lo, k_hi].
Visibility classify(int64_t p_lo, int64_t p_hi, int64_t k_lo, int64_t k_hi, const AttentionDims& d) {
  if (!d.causal) return Visibility::All;
  const int64_t window = d.window;
  if (k_lo > p_hi || (window && p_lo - k_hi >= window)) return Visibility::None;
  const bool all = k_hi <= p_lo && (window == 0 || p_hi - k_lo < window);
  return all ? Visibility::All : Visibility::Some;
}

// Sets to -inf the scores s [nk × ld] (key j0+j in row j, the query at position p0+i in column i)
// of keys the query does not see: key κ is visible to position p iff κ <= p and p - κ < window.
void mask_tile(float* s, int64_t nk, int64_t ld, int64_t j0, int64_t p0, int64_t window) {
  const Vec hidden = negative_infinity();
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t first = j0 + j - p0;  // first column that sees key j0+j
    for (int64_t i = 0; i < ld; i += kLanes) {
      const Mask visible = lane_range(first - i, window ? first + window - i : kLanes);
      if (visible != kAll) store(s + j * ld + i, select(visible, hidden, load(s + j * ld + i)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

// One key tile of the online softmax. s [nk × ld] holds scores (keys in rows) and is overwritten
// with exp(s - m_new); m, l are the running max and sum of each query column, alpha receives
// exp(m_old - m_new), the factor that rescales the output accumulated so far.
void softmax_step(float* s, int64_t nk, int64_t ld, float* m, float* l, float* alpha) {
  for (int64_t i = 0; i < ld; i += kLanes) {
    const Vec m_old = load(m + i);
    Vec mx[4] = {m_old, m_old, m_old, m_old};  // four chains: max's latency would bound one
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4)
      for (int c = 0; c < 4; ++c) mx[c] = max(mx[c], load(s + (j + c) * ld + i));
    for (; j < nk; ++j) mx[0] = max(mx[0], load(s + j * ld + i));
    const Vec m_new = max(max(mx[0], mx[1]), max(mx[2], mx[3]));
    // A query that has seen only hidden keys still has max -inf; subtracting 0 instead of -inf keeps
    // exp(-inf - max) at 0 rather than NaN.
    const Vec base = select(equal(m_new, negative_infinity()), m_new, zero());
    const Vec a = exp(m_old - base);
    Vec sum0 = zero(), sum1 = zero();  // two chains, for the same reason
    for (j = 0; j + 1 < nk; j += 2) {
      const Vec p0 = exp(load(s + j * ld + i) - base), p1 = exp(load(s + (j + 1) * ld + i) - base);
      store(s + j * ld + i, p0);
      store(s + (j + 1) * ld + i, p1);
      sum0 = sum0 + p0;
      sum1 = sum1 + p1;
    }
    if (j < nk) {
      const Vec p = exp(load(s + j * ld + i) - base);
      store(s + j * ld + i, p);
      sum0 = sum0 + p;
    }
    store(l + i, fmadd(a, load(l + i), sum0 + sum1));
    store(m + i, m_new);
    store(alpha + i, a);
  }
}

// Keys and values of one (sequence, head) as operands of Ops: key j's row (steps(Dq) elements) at
// k + j*ldk, value k-step row t (one key for F32, a pair of keys for BF16Pairs) at v + t*ldv.
template <class Ops>
struct KeysValues {
  const typename Ops::Elem* k;
  int64_t ldk;
  const typename Ops::Elem* v;
  int64_t ldv;
};

// The query operand of the score product (scale folded in) and the probability operand of O += P·V,
// in each format. F32 uses the probabilities in place.
void pack_query(const float* x, int64_t ldx, int64_t rows, int64_t cols, float scale, float* out, int64_t ld) {
  pack_transposed(x, ldx, rows, cols, scale, out, ld);
}
void pack_query(const float* x, int64_t ldx, int64_t rows, int64_t cols, float scale, Pair* out, int64_t ld) {
  pack_query_pairs(x, ldx, rows, cols, scale, out, ld);
}
const float* probability_operand(const float* p, int64_t, int64_t, float*) { return p; }
const Pair* probability_operand(const float* p, int64_t nk, int64_t ld, Pair* out) {
  for (int64_t t = 0; 2 * t < nk; ++t)  // rows 2t and 2t+1 (keys) paired; an odd last row pairs with 0
    pack_pairs(p + 2 * t * ld, 2 * t + 1 < nk ? p + (2 * t + 1) * ld : nullptr, ld, out + t * ld);
  return out;
}

size_t forward_floats(const AttentionDims& d) {
  return size_t(d.qk_dim * kTileQ + kTileK * kTileQ + kTileK / 2 * kTileQ + kTileQ * d.v_dim + 3 * kTileQ);
}

// Output rows and lse of query tile `qt` of sequence s, head h.
template <class Ops>
void forward_tile(const AttentionDims& d, const Sequence& s, int64_t h, int64_t qt, const float* q,
                  const KeysValues<Ops>& kv, float* o, float* lse, float* buffer) {
  using Elem = typename Ops::Elem;
  const int64_t H = d.heads, Dq = d.qk_dim, Dv = d.v_dim, ldq = H * Dq;
  const int64_t i0 = qt * kTileQ, nq = std::min(kTileQ, s.q_len - i0), ld = round_up(nq, kLanes);
  const int64_t p0 = s.offset() + i0;  // position of the tile's first query
  Elem* q_op = reinterpret_cast<Elem*>(buffer);         // [steps(Dq) × ld] scale · Qᵀ
  float* scores = buffer + Dq * kTileQ;                 // [nk × ld] scores, then probabilities
  Elem* p_op = reinterpret_cast<Elem*>(scores + kTileK * kTileQ);  // [steps(nk) × ld] (BF16Pairs)
  float* acc = scores + kTileK * kTileQ + kTileK / 2 * kTileQ;     // [nq × Dv] unnormalised output
  float* m = acc + kTileQ * Dv;
  float* l = m + kTileQ;
  float* alpha = l + kTileQ;

  pack_query(q + (s.q_begin + i0) * ldq + h * Dq, ldq, nq, Dq, d.scale, q_op, ld);
  std::fill(m, m + ld, -std::numeric_limits<float>::infinity());
  std::fill(l, l + ld, 0.0f);
  bool first = true;
  const Range keys = key_tiles(s, p0, p0 + nq - 1, d);
  for (int64_t kt = keys.first; kt <= keys.last; ++kt) {
    const int64_t j0 = kt * kTileK, nk = std::min(kTileK, s.kv_len - j0);
    const Visibility vis = classify(p0, p0 + nq - 1, j0, j0 + nk - 1, d);
    if (vis == Visibility::None) continue;
    product<Ops, false, Out::Set>(nk, ld, Ops::steps(Dq), kv.k + j0 * kv.ldk, kv.ldk, q_op, ld, scores, ld);
    if (vis == Visibility::Some) mask_tile(scores, nk, ld, j0, p0, d.window);
    softmax_step(scores, nk, ld, m, l, alpha);
    const Elem* p = probability_operand(scores, nk, ld, p_op);
    const Elem* vt = kv.v + Ops::steps(j0) * kv.ldv;  // j0 is even: pairs start on a tile
    if (first) product<Ops, true, Out::Set>(nq, Dv, Ops::steps(nk), p, ld, vt, kv.ldv, acc, Dv);
    else product<Ops, true, Out::Rescale>(nq, Dv, Ops::steps(nk), p, ld, vt, kv.ldv, acc, Dv, alpha);
    first = false;
  }
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t row = (s.q_begin + i0 + i) * H + h;
    float* out = o + row * Dv;
    const bool seen = !first && l[i] > 0.0f;  // false only for a query that sees no key
    const float inv = seen ? 1.0f / l[i] : 0.0f;
    for (int64_t e = 0; e < Dv; ++e) out[e] = seen ? acc[i * Dv + e] * inv : 0.0f;
    lse[row] = seen ? m[i] + std::log(l[i]) : -std::numeric_limits<float>::infinity();
  }
}

// bf16 copies of k and v for BF16Pairs, made once per call. k16: key row j holds, per head, the
// pairs (2p, 2p+1) of its Dq values (Dq padded to even): k_words = H * steps(Dq) words a row.
// v2: per sequence, pair row t holds keys 2t and 2t+1 of the sequence interleaved per value
// (the second is 0 past the end); sequence b's pair rows start at (k_begin + b + 1) / 2, which
// keeps them disjoint whatever the lengths' parities.
struct Bf16Copies {
  Pair* k16;
  Pair* v2;
  int64_t k_words, v_words;  // per key row (H * steps(Dq)), per pair row (H * Dv)
};

int64_t pair_row_begin(int64_t b, const Sequence& s) { return (s.k_begin + b + 1) / 2; }

size_t bf16_copy_words(const AttentionDims& d, int64_t batch, int64_t keys) {
  return size_t(keys * d.heads * BF16Pairs::steps(d.qk_dim) + ((keys + batch + 1) / 2) * d.heads * d.v_dim);
}

// Fills the copies; called by every thread of a parallel region (it shares the rows out).
void convert_keys_values(const AttentionDims& d, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                         const float* k, const float* v, const Bf16Copies& c) {
  const int64_t H = d.heads, Dq = d.qk_dim, Dv = d.v_dim, keys = k_starts[batch];
#pragma omp for schedule(static)
  for (int64_t j = 0; j < keys; ++j) {
    for (int64_t h = 0; h < H; ++h) {
      const float* x = k + (j * H + h) * Dq;
      Pair* out = c.k16 + j * c.k_words + h * BF16Pairs::steps(Dq);
      pack_consecutive_pairs(x, Dq, out);
    }
    if (!c.v2) continue;  // the AMX path takes vt2 instead (build_vt2)
    const int64_t b = std::upper_bound(k_starts, k_starts + batch + 1, j) - k_starts - 1;
    const Sequence s = sequence(b, q_starts, k_starts);
    const int64_t t2 = j - s.k_begin;  // this key's index in its sequence
    if (t2 % 2 == 0)
      pack_pairs(v + j * H * Dv, t2 + 1 < s.kv_len ? v + (j + 1) * H * Dv : nullptr, H * Dv,
                 c.v2 + (pair_row_begin(b, s) + t2 / 2) * c.v_words);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

// From scores s and dP = dO·Vᵀ (both [nk × ld], keys in rows): P = exp(s - lse) into s and
// scale · dS = scale · P ∘ (dP - D) into dp, D_i = rowsum(dO_i ∘ O_i).
void probabilities_and_scores(float* s, float* dp, int64_t nk, int64_t ld, const float* lse, const float* delta,
                              float scale) {
  const Vec sc = broadcast(scale);
  for (int64_t i = 0; i < ld; i += kLanes) {
    const Vec L = load(lse + i), D = load(delta + i);
    for (int64_t j = 0; j < nk; ++j) {
      const Vec p = exp(load(s + j * ld + i) - L);
      store(s + j * ld + i, p);
      store(dp + j * ld + i, sc * p * (load(dp + j * ld + i) - D));
    }
  }
}

size_t backward_floats(const AttentionDims& d, int64_t max_q_len) {
  return size_t(round_up(max_q_len, kTileQ) * (d.qk_dim + d.v_dim + 2) + 2 * kTileK * kTileQ);
}

// Gradients from key tiles [kt_begin, kt_end) of sequence s, head h: writes their dk and dv rows and
// adds their share of dq to dq_out [q_len × ld_dq], which it zeroes first.
void backward_unit(const AttentionDims& d, const Sequence& s, int64_t h, int64_t kt_begin, int64_t kt_end,
                   const float* q, const float* k, const float* v, const float* o, const float* lse, const float* d_o,
                   float* dq_out, int64_t ld_dq, float* dk, float* dv, float* buffer) {
  const int64_t H = d.heads, Dq = d.qk_dim, Dv = d.v_dim, ldq = H * Dq, ldv = H * Dv;
  const int64_t q_tiles = ceil_div(s.q_len, kTileQ);
  float* q_packed = buffer;                          // per query tile [Dq × ld]: scale · Qᵀ
  float* do_packed = q_packed + q_tiles * kTileQ * Dq;  // per query tile [Dv × ld]: dOᵀ
  float* lse_q = do_packed + q_tiles * kTileQ * Dv;     // per query (+inf: sees no key, P = 0)
  float* delta = lse_q + q_tiles * kTileQ;              // D_i = rowsum(dO_i ∘ O_i)
  float* scores = delta + q_tiles * kTileQ;             // [nk × ld] scores, then P
  float* dscores = scores + kTileK * kTileQ;            // [nk × ld] dP, then scale · dS

  const float* qh = q + s.q_begin * ldq + h * Dq;
  const float* kh = k + s.k_begin * ldq + h * Dq;
  const float* vh = v + s.k_begin * ldv + h * Dv;
  const float* oh = o + s.q_begin * ldv + h * Dv;
  const float* doh = d_o + s.q_begin * ldv + h * Dv;
  float* dkh = dk + s.k_begin * ldq + h * Dq;
  float* dvh = dv + s.k_begin * ldv + h * Dv;

  for (int64_t i = 0; i < s.q_len; ++i) std::fill(dq_out + i * ld_dq, dq_out + i * ld_dq + Dq, 0.0f);
  const Range seen_by = query_tiles(s, kt_begin * kTileK, std::min(kt_end * kTileK, s.kv_len) - 1, d);
  for (int64_t qt = seen_by.first; qt <= seen_by.last; ++qt) {
    const int64_t i0 = qt * kTileQ, nq = std::min(kTileQ, s.q_len - i0), ld = round_up(nq, kLanes);
    pack_transposed(qh + i0 * ldq, ldq, nq, Dq, d.scale, q_packed + i0 * Dq, ld);
    pack_transposed(doh + i0 * ldv, ldv, nq, Dv, 1.0f, do_packed + i0 * Dv, ld);
    constexpr float kInf = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < ld; ++i) {  // padding columns (i >= nq) get P = 0
      const float L = i < nq ? lse[(s.q_begin + i0 + i) * H + h] : -kInf;
      lse_q[i0 + i] = L == -kInf ? kInf : L;
      float D = 0.0f;
      if (i < nq)
        for (int64_t e = 0; e < Dv; ++e) D += doh[(i0 + i) * ldv + e] * oh[(i0 + i) * ldv + e];
      delta[i0 + i] = D;
    }
  }

  for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
    const int64_t j0 = kt * kTileK, nk = std::min(kTileK, s.kv_len - j0);
    for (int64_t j = j0; j < j0 + nk; ++j) {
      std::fill(dkh + j * ldq, dkh + j * ldq + Dq, 0.0f);
      std::fill(dvh + j * ldv, dvh + j * ldv + Dv, 0.0f);
    }
    const Range queries = query_tiles(s, j0, j0 + nk - 1, d);
    for (int64_t qt = queries.first; qt <= queries.last; ++qt) {
      const int64_t i0 = qt * kTileQ, nq = std::min(kTileQ, s.q_len - i0), ld = round_up(nq, kLanes);
      const int64_t p0 = s.offset() + i0;
      const Visibility vis = classify(p0, p0 + nq - 1, j0, j0 + nk - 1, d);
      if (vis == Visibility::None) continue;
      product<F32, false, Out::Set>(nk, ld, Dq, kh + j0 * ldq, ldq, q_packed + i0 * Dq, ld, scores, ld);
      if (vis == Visibility::Some) mask_tile(scores, nk, ld, j0, p0, d.window);
      product<F32, false, Out::Set>(nk, ld, Dv, vh + j0 * ldv, ldv, do_packed + i0 * Dv, ld, dscores, ld);
      probabilities_and_scores(scores, dscores, nk, ld, lse_q + i0, delta + i0, d.scale);
      product<F32, false, Out::Add>(nk, Dv, nq, scores, ld, doh + i0 * ldv, ldv, dvh + j0 * ldv, ldv);   // dV += Pᵀ dO
      product<F32, false, Out::Add>(nk, Dq, nq, dscores, ld, qh + i0 * ldq, ldq, dkh + j0 * ldq, ldq);  // dK += dSᵀ Q
      product<F32, true, Out::Add>(nq, Dq, nk, dscores, ld, kh + j0 * ldq, ldq, dq_out + i0 * ld_dq, ld_dq);  // dQ += dS K
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The forward pass on AMX tiles (bf16 products where the CPU has AMX-BF16 and the kernel grants
// the tile state, Dqk and Dv multiples of 16). The same units, tiles, masks and online
// softmax as the vector path; the two products run as tile products:
//   scores  Sᵀ [keys × queries] = K · (scale · Q)ᵀ: A tiles are k16's rows as they lie (16 keys ×
//           32 values of a head), B tiles the packed query pairs (16 value pairs × 16 queries);
//   values  Oᵀ [Dv × queries] += Vᵀ · P: A tiles are vt2's rows (16 values × 16 key pairs), B tiles
//           the probabilities paired by key (16 key pairs × 16 queries).
// Up to kStepTiles key tiles share one softmax update, so that the tile products run in bursts
// over 256 keys (the TMUL unit slows down when vector work separates its instructions,
// latent_attention_amx.h), and each step's Oᵀ is added, rescaled, into the tile's output once.
#if defined(HYLA_AMX_TILES)

constexpr int64_t kStepTiles = 4;

bool amx_forward(const AttentionDims& d) {
  return d.bf16_products && d.qk_dim % 16 == 0 && d.v_dim % 16 == 0 && amx_tiles();
}

// vt2 of one (sequence, head), [Dv][vt2_pairs] pairs: row e holds (v[2t][e], v[2t + 1][e]) for the
// sequence's keys, zero past them (a value product's last A tile reads up to 16 pairs past a step).
int64_t vt2_pairs(int64_t kv_len) { return round_up(ceil_div(kv_len, 2), 16); }

size_t vt2_words(const AttentionDims& d, int64_t batch, const int64_t* k_starts) {
  int64_t words = 0;
  for (int64_t b = 0; b < batch; ++b) words += d.heads * d.v_dim * vt2_pairs(k_starts[b + 1] - k_starts[b]);
  return size_t(words);
}

// Sequence b's vt2 block (its heads one after the other).
int64_t vt2_offset(const AttentionDims& d, int64_t b, const int64_t* k_starts) {
  int64_t words = 0;
  for (int64_t i = 0; i < b; ++i) words += d.heads * d.v_dim * vt2_pairs(k_starts[i + 1] - k_starts[i]);
  return words;
}

// Fills vt2 for every (sequence, head); called by every thread of a parallel region.
void build_vt2(const AttentionDims& d, int64_t batch, const int64_t* k_starts, const float* v, Pair* vt2) {
  const int64_t H = d.heads, Dv = d.v_dim;
#pragma omp for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < batch * H; ++bh) {
    const int64_t b = bh / H, h = bh % H, kv_len = k_starts[b + 1] - k_starts[b], pairs = vt2_pairs(kv_len);
    Pair* out = vt2 + vt2_offset(d, b, k_starts) + h * Dv * pairs;
    Pair row[1024];  // one key pair's Dv words (Dv <= 1024: checked by amx_forward's caller)
    for (int64_t t = 0; t < pairs; ++t) {
      const int64_t j = 2 * t;
      if (j < kv_len) {
        const float* lo = v + ((k_starts[b] + j) * H + h) * Dv;
        pack_pairs(lo, j + 1 < kv_len ? lo + H * Dv : nullptr, Dv, row);
      } else {
        std::fill(row, row + Dv, 0u);
      }
      for (int64_t e = 0; e < Dv; ++e) out[e * pairs + t] = row[e];
    }
  }
}

size_t amx_forward_floats(const AttentionDims& d) {
  const int64_t keys = kStepTiles * kTileK;
  return size_t(d.qk_dim / 2 * kTileQ + keys * kTileQ + (keys / 2 + 16) * kTileQ + d.v_dim * kTileQ + 16 * kTileQ +
                3 * kTileQ + 16 * d.qk_dim / 2 + 16);
}

// Output rows and lse of query tile `qt` of sequence s, head h, on tiles. kv: k16's rows of this
// (sequence, head); vt: its vt2 block.
void forward_tile_amx(const AttentionDims& d, const Sequence& s, int64_t h, int64_t qt, const float* q,
                      const KeysValues<BF16Pairs>& kv, const Pair* vt, float* o, float* lse, float* buffer) {
  const int64_t H = d.heads, Dq = d.qk_dim, Dv = d.v_dim, ldq = H * Dq, words = Dq / 2;
  const int64_t i0 = qt * kTileQ, nq = std::min(kTileQ, s.q_len - i0), ld = round_up(nq, kLanes);
  const int64_t groups = ld / 16, pairs = vt2_pairs(s.kv_len), ld_bytes = ld * int64_t(sizeof(float));
  const int64_t p0 = s.offset() + i0;  // position of the tile's first query
  Pair* q_op = reinterpret_cast<Pair*>(buffer);                 // [words × ld] scale · Qᵀ as pairs
  float* scores = buffer + words * kTileQ;                      // [step keys × ld]
  Pair* p_op = reinterpret_cast<Pair*>(scores + kStepTiles * kTileK * kTileQ);  // [key pairs × ld]
  float* out_t = scores + kStepTiles * kTileK * kTileQ + (kStepTiles * kTileK / 2 + 16) * kTileQ;  // Oᵀ [Dv × ld]
  float* part = out_t + Dv * kTileQ;   // [16 × ld] one value block of a step
  float* m = part + 16 * kTileQ;
  float* l = m + kTileQ;
  float* alpha = l + kTileQ;
  Pair* staged = reinterpret_cast<Pair*>(alpha + kTileQ);  // [16 × words] a last group of keys, then zeros

  pack_query(q + (s.q_begin + i0) * ldq + h * Dq, ldq, nq, Dq, d.scale, q_op, ld);
  std::fill(m, m + ld, -std::numeric_limits<float>::infinity());
  std::fill(l, l + ld, 0.0f);
  // Tiles 0-3: Sᵀ or Oᵀ blocks [16 × 16] f32; 6 and 7: A [16 × 32] and B [16 pairs × 16] bf16; 4 and
  // 5: the A and B of a score product's last 16 values when Dqk is an odd multiple of 16.
  static const amx::TileConfig config = [] {
    amx::TileConfig c;
    for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.bytes_per_row[t] = 64;
    c.bytes_per_row[4] = 32, c.rows[5] = 8;
    return c;
  }();
  _tile_loadconfig(&config);
  bool first = true;
  const Range keys = key_tiles(s, p0, p0 + nq - 1, d);
  for (int64_t kt0 = keys.first; kt0 <= keys.last; kt0 += kStepTiles) {
    const int64_t kt1 = std::min(keys.last + 1, kt0 + kStepTiles), j0 = kt0 * kTileK;
    const int64_t nk = std::min(kt1 * kTileK, s.kv_len) - j0;
    // Sᵀ of the step's keys, 16 at a time against every group of 16 queries.
    for (int64_t j = 0; j < nk; j += 16) {
      const Pair* rows = kv.k + (j0 + j) * kv.ldk;
      int64_t ld_rows = kv.ldk;
      if (nk - j < 16) {  // the sequence's last keys: nothing past them is read
        for (int64_t r = 0; r < 16; ++r)
          for (int64_t w = 0; w < words; ++w) staged[r * words + w] = j + r < nk ? rows[r * kv.ldk + w] : 0u;
        rows = staged, ld_rows = words;
      }
      for (int64_t g = 0; g < groups; ++g) amx::zero(int(g));
      for (int64_t c = 0; c < words / 16; ++c) {
        _tile_loadd(6, rows + c * 16, ld_rows * int64_t(sizeof(Pair)));
        for (int64_t g = 0; g < groups; ++g) {
          _tile_loadd(7, q_op + c * 16 * ld + g * 16, ld_bytes);
          amx::accumulate(int(g));
        }
      }
      if (words % 16 != 0) {  // the last 16 values: 8 pairs
        const int64_t c = words / 16;
        _tile_loadd(4, rows + c * 16, ld_rows * int64_t(sizeof(Pair)));
        for (int64_t g = 0; g < groups; ++g) {
          _tile_loadd(5, q_op + c * 16 * ld + g * 16, ld_bytes);
          amx::accumulate_short(int(g));
        }
      }
      for (int64_t g = 0; g < groups; ++g) amx::store(int(g), scores + j * ld + g * 16, ld_bytes);
    }
    for (int64_t kt = kt0; kt < kt1; ++kt) {
      const int64_t jt = kt * kTileK, n = std::min(kTileK, s.kv_len - jt);
      if (classify(p0, p0 + nq - 1, jt, jt + n - 1, d) == Visibility::Some)
        mask_tile(scores + (jt - j0) * ld, n, ld, jt, p0, d.window);
    }
    softmax_step(scores, nk, ld, m, l, alpha);
    probability_operand(scores, nk, ld, p_op);
    const int64_t key_pairs = BF16Pairs::steps(nk), steps = ceil_div(key_pairs, int64_t(16));
    std::fill(p_op + key_pairs * ld, p_op + steps * 16 * ld, 0u);
    // Oᵀ += Vᵀ · P, a block of 16 values at a time.
    for (int64_t e0 = 0; e0 < Dv; e0 += 16) {
      for (int64_t g = 0; g < groups; ++g) amx::zero(int(g));
      for (int64_t step = 0; step < steps; ++step) {
        _tile_loadd(6, vt + e0 * pairs + j0 / 2 + step * 16, pairs * int64_t(sizeof(Pair)));
        for (int64_t g = 0; g < groups; ++g) {
          _tile_loadd(7, p_op + step * 16 * ld + g * 16, ld_bytes);
          amx::accumulate(int(g));
        }
      }
      for (int64_t g = 0; g < groups; ++g) amx::store(int(g), part + g * 16, ld_bytes);
      for (int64_t r = 0; r < 16; ++r) {
        float* row = out_t + (e0 + r) * ld;
        for (int64_t i = 0; i < ld; i += kLanes) {
          const Vec add = load(part + r * ld + i);
          store(row + i, first ? add : fmadd(load(alpha + i), load(row + i), add));
        }
      }
    }
    first = false;
  }
  _tile_release();
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t row = (s.q_begin + i0 + i) * H + h;
    float* out = o + row * Dv;
    const bool seen = !first && l[i] > 0.0f;  // false only for a query that sees no key
    const float inv = seen ? 1.0f / l[i] : 0.0f;
    for (int64_t e = 0; e < Dv; ++e) out[e] = seen ? out_t[e * ld + i] * inv : 0.0f;
    lse[row] = seen ? m[i] + std::log(l[i]) : -std::numeric_limits<float>::infinity();
  }
}

#endif  // HYLA_AMX_TILES


void check_arguments(const AttentionDims& d, int64_t batch, const int64_t* q_starts, const int64_t* k_starts) {
  HYLA_CHECK(d.heads > 0 && d.qk_dim > 0 && d.v_dim > 0 && d.window >= 0,
             "attention: need heads, qk_dim, v_dim > 0 and window >= 0, got {}, {}, {}, {}", d.heads, d.qk_dim,
             d.v_dim, d.window);
  HYLA_CHECK(batch >= 0, "attention: negative batch {}", batch);
  HYLA_CHECK(d.causal || d.window == 0, "attention: a window ({}) needs causal attention", d.window);
  for (int64_t b = 0; b < batch; ++b) {
    HYLA_CHECK(q_starts[b + 1] >= q_starts[b] && k_starts[b + 1] >= k_starts[b],
               "attention: sequence {} has decreasing q_starts or k_starts", b);
    HYLA_CHECK(d.causal || q_starts[b + 1] - q_starts[b] == k_starts[b + 1] - k_starts[b],
               "attention: sequence {} has {} queries and {} keys; bidirectional attention needs as many", b,
               q_starts[b + 1] - q_starts[b], k_starts[b + 1] - k_starts[b]);
  }
}

}  // namespace

void attention_forward(const AttentionDims& d, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                       const float* q, const float* k, const float* v, float* o, float* lse,
                       Workspace& workspace) {
  check_arguments(d, batch, q_starts, k_starts);
  workspace.reserve();
  Frame frame(workspace.serial());
  // Units: (sequence, head, query tile), costed by the key tiles they visit. They run grouped by
  // (sequence, head), so consecutive units on a thread reuse that head's K and V from L2 (worth
  // ~20% at 8 × 512 tokens against a cost-only order); groups run costliest sequence first and,
  // within a group, costliest tile first, so the causal tail is cheap tiles that fill in the gaps.
  int64_t n = 0;
  for (int64_t b = 0; b < batch; ++b) n += ceil_div(sequence(b, q_starts, k_starts).q_len, kTileQ) * d.heads;
  Unit* const units = frame.take<Unit>(n);
  n = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const Sequence s = sequence(b, q_starts, k_starts);
    const int64_t first = n;
    int64_t sequence_cost = 0;
    for (int64_t qt = 0; qt < ceil_div(s.q_len, kTileQ); ++qt) {
      const int64_t p0 = s.offset() + qt * kTileQ, p1 = p0 + std::min(kTileQ, s.q_len - qt * kTileQ) - 1;
      const Range keys = key_tiles(s, p0, p1, d);
      const int64_t cost = 1 + keys.last - keys.first + 1;
      sequence_cost += cost;
      for (int64_t h = 0; h < d.heads; ++h) units[n++] = {b, h, qt, qt + 1, cost, 0, -1};
    }
    for (int64_t u = first; u < n; ++u) units[u].group_cost = sequence_cost;
  }
  std::sort(units, units + n, [](const Unit& x, const Unit& y) {
    return std::tie(y.group_cost, x.seq, x.head, y.cost) < std::tie(x.group_cost, y.seq, y.head, x.cost);
  });
  const int64_t keys = k_starts[batch];
#if defined(HYLA_AMX_TILES)
  const bool tiles = amx_forward(d) && d.v_dim <= 1024;
  Pair* vt2 = tiles ? frame.take<Pair>(int64_t(vt2_words(d, batch, k_starts))) : nullptr;
  const size_t floats = tiles ? amx_forward_floats(d) : forward_floats(d);
#else
  const size_t floats = forward_floats(d);
#endif
  Pair* k16 = d.bf16_products ? frame.take<Pair>(int64_t(bf16_copy_words(d, batch, keys))) : nullptr;
  Bf16Copies copies{k16, k16 + keys * d.heads * BF16Pairs::steps(d.qk_dim), d.heads * BF16Pairs::steps(d.qk_dim),
                    d.heads * d.v_dim};
#if defined(HYLA_AMX_TILES)
  if (tiles) copies.v2 = nullptr;
#endif
#pragma omp parallel
  {
    if (d.bf16_products) convert_keys_values(d, batch, q_starts, k_starts, k, v, copies);  // ends in a barrier
#if defined(HYLA_AMX_TILES)
    if (tiles) build_vt2(d, batch, k_starts, v, vt2);  // ends in a barrier
#endif
    Frame thread_frame(workspace.thread(omp_get_thread_num()));
    float* buffer = thread_frame.take<float>(int64_t(floats));
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n; ++u) {
      const Unit& unit = units[u];
      const Sequence s = sequence(unit.seq, q_starts, k_starts);
      const int64_t h = unit.head;
#if defined(HYLA_AMX_TILES)
      if (tiles) {
        const KeysValues<BF16Pairs> kv{copies.k16 + s.k_begin * copies.k_words + h * BF16Pairs::steps(d.qk_dim),
                                       copies.k_words, nullptr, 0};
        const Pair* vt = vt2 + vt2_offset(d, unit.seq, k_starts) + h * d.v_dim * vt2_pairs(s.kv_len);
        forward_tile_amx(d, s, h, unit.begin, q, kv, vt, o, lse, buffer);
        continue;
      }
#endif
      if (d.bf16_products) {
        const KeysValues<BF16Pairs> kv{copies.k16 + s.k_begin * copies.k_words + h * BF16Pairs::steps(d.qk_dim),
                                       copies.k_words,
                                       copies.v2 + pair_row_begin(unit.seq, s) * copies.v_words + h * d.v_dim,
                                       copies.v_words};
        forward_tile(d, s, h, unit.begin, q, kv, o, lse, buffer);
      } else {
        const int64_t ldk = d.heads * d.qk_dim, ldv = d.heads * d.v_dim;
        const KeysValues<F32> kv{k + s.k_begin * ldk + h * d.qk_dim, ldk, v + s.k_begin * ldv + h * d.v_dim, ldv};
        forward_tile(d, s, h, unit.begin, q, kv, o, lse, buffer);
      }
    }
  }
}

void attention_backward(const AttentionDims& d, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                        const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* d_o, float* dq, float* dk, float* dv, Workspace& workspace) {
  check_arguments(d, batch, q_starts, k_starts);
  HYLA_CHECK(!d.bf16_products, "attention_backward: bf16_products is for the forward pass only");
  workspace.reserve();
  Frame frame(workspace.serial());
  const int threads = omp_get_max_threads();
  // Units are whole (sequence, head) pairs walked key tile by key tile: a unit owns its dk/dv rows
  // and its dq rows, so there are no races and the result does not depend on the thread count.
  // Only when there are fewer pairs than threads is each pair's key range cut into `parts` pieces
  // of about equal cost; each piece but the first adds dq into its own buffer, and the buffers are
  // summed in piece order at the end.
  const int64_t pairs = batch * d.heads;
  const int64_t parts = pairs >= threads ? 1 : ceil_div(threads, std::max<int64_t>(pairs, 1));
  auto pieces_of = [&](const Sequence& s) {
    return std::clamp<int64_t>(parts, 1, std::max<int64_t>(ceil_div(s.kv_len, kTileK), 1));
  };
  int64_t n = 0;
  for (int64_t b = 0; b < batch; ++b) n += d.heads * pieces_of(sequence(b, q_starts, k_starts));
  Unit* const units = frame.take<Unit>(n);
  n = 0;
  int64_t max_q_len = 0, partial_floats = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const Sequence s = sequence(b, q_starts, k_starts);
    max_q_len = std::max(max_q_len, s.q_len);
    const int64_t key_tiles_n = ceil_div(s.kv_len, kTileK);
    // Cost of key tile kt: the query tiles that see it (+1 for its own bookkeeping).
    auto cost = [&](int64_t kt) {
      const Range r = query_tiles(s, kt * kTileK, std::min((kt + 1) * kTileK, s.kv_len) - 1, d);
      return 1 + r.last - r.first + 1;
    };
    int64_t total = 1;
    for (int64_t kt = 0; kt < key_tiles_n; ++kt) total += cost(kt);
    for (int64_t h = 0; h < d.heads; ++h) {
      const int64_t pieces = pieces_of(s);
      int64_t begin = 0, done = 0;
      for (int64_t p = 0; p < pieces; ++p) {
        int64_t end = begin, piece_cost = 0;
        // Take key tiles until this piece reaches its share of the total (the last takes the rest).
        while (end < key_tiles_n && (p == pieces - 1 || done + piece_cost < total * (p + 1) / pieces))
          piece_cost += cost(end++);
        const int64_t partial = p == 0 ? -1 : partial_floats;
        if (p > 0) partial_floats += s.q_len * d.qk_dim;
        units[n++] = {b, h, begin, end, piece_cost + 1, 0, partial};
        done += piece_cost;
        begin = end;
      }
    }
  }
  std::sort(units, units + n, [](const Unit& x, const Unit& y) { return x.cost > y.cost; });
  float* const partials = frame.take<float>(partial_floats);
  const int64_t ldq = d.heads * d.qk_dim;
#pragma omp parallel
  {
    Frame thread_frame(workspace.thread(omp_get_thread_num()));
    float* buffer = thread_frame.take<float>(int64_t(backward_floats(d, max_q_len)));
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n; ++u) {
      const Unit& unit = units[u];
      const Sequence s = sequence(unit.seq, q_starts, k_starts);
      float* dq_out = unit.partial < 0 ? dq + s.q_begin * ldq + unit.head * d.qk_dim : partials + unit.partial;
      backward_unit(d, s, unit.head, unit.begin, unit.end, q, k, v, o, lse, d_o, dq_out,
                    unit.partial < 0 ? ldq : d.qk_dim, dk, dv, buffer);
    }
  }
  if (partial_floats == 0) return;
  // Add the pieces' dq buffers in piece order (partial offsets grow with the piece index).
  std::sort(units, units + n, [](const Unit& x, const Unit& y) { return x.partial < y.partial; });
  for (const Unit& unit : std::span<const Unit>(units, size_t(n))) {
    if (unit.partial < 0) continue;
    const Sequence s = sequence(unit.seq, q_starts, k_starts);
    const float* part = partials + unit.partial;
    float* dqh = dq + s.q_begin * ldq + unit.head * d.qk_dim;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.q_len; ++i)
      for (int64_t e = 0; e < d.qk_dim; ++e) dqh[i * ldq + e] += part[i * d.qk_dim + e];
  }
}

bool attention_use_bf16_products(bool allowed) { return allowed && native_bf16_products(); }

}  // namespace hyla
