#include "hyla/kernels/small_gemm.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "hyla/core/arith.h"
#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/kernels/cpu/vec.h"

namespace hyla {
namespace {

#if defined(__AVX512F__)

__mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// One register block: ROWS rows × (16 · VECS) columns of C, the last vector masked by `last`.
template <int ROWS, int VECS, bool TRANS_A>
void block_f32(int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
               int64_t ldc, __mmask16 last) {
  __m512 acc[ROWS * VECS];
  vec::unroll<ROWS * VECS>([&](auto i) { acc[i] = _mm512_setzero_ps(); });
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[VECS];
    vec::unroll<VECS>([&](auto v) {
      b[v] = v + 1 < VECS ? _mm512_loadu_ps(B + k * ldb + 16 * v) : _mm512_maskz_loadu_ps(last, B + k * ldb + 16 * v);
    });
    vec::unroll<ROWS>([&](auto r) {
      const __m512 a = _mm512_set1_ps(TRANS_A ? A[k * lda + r] : A[r * lda + k]);
      vec::unroll<VECS>([&](auto v) { acc[r * VECS + v] = _mm512_fmadd_ps(a, b[v], acc[r * VECS + v]); });
    });
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  vec::unroll<ROWS * VECS>([&](auto i) {
    constexpr int r = i / VECS, v = i % VECS;
    float* c = C + r * ldc + 16 * v;
    const __mmask16 m = v + 1 < VECS ? __mmask16(0xffff) : last;
    __m512 out = _mm512_mul_ps(acc[i], va);
    if (beta != 0.0f) out = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, c), vb, out);
    _mm512_mask_storeu_ps(c, m, out);
  });
}

template <int ROWS, bool TRANS_A>
void row_panel_f32(int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                   float beta, float* C, int64_t ldc) {
  int64_t j = 0;
  for (; j + 64 <= N; j += 64)
    block_f32<ROWS, 4, TRANS_A>(K, alpha, A, lda, B + j, ldb, beta, C + j, ldc, 0xffff);
  const int64_t rest = N - j;
  if (rest == 0) return;
  const __mmask16 last = tail_mask(rest - (rest - 1) / 16 * 16);
  switch ((rest + 15) / 16) {
    case 1: block_f32<ROWS, 1, TRANS_A>(K, alpha, A, lda, B + j, ldb, beta, C + j, ldc, last); break;
    case 2: block_f32<ROWS, 2, TRANS_A>(K, alpha, A, lda, B + j, ldb, beta, C + j, ldc, last); break;
    case 3: block_f32<ROWS, 3, TRANS_A>(K, alpha, A, lda, B + j, ldb, beta, C + j, ldc, last); break;
    default: block_f32<ROWS, 4, TRANS_A>(K, alpha, A, lda, B + j, ldb, beta, C + j, ldc, last); break;
  }
}

template <bool TRANS_A>
void small_gemm_f32(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                    int64_t ldb, float beta, float* C, int64_t ldc) {
  constexpr int kRows = 6;
  auto a_rows = [&](int64_t i) { return TRANS_A ? A + i : A + i * lda; };
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows)
    row_panel_f32<kRows, TRANS_A>(N, K, alpha, a_rows(i), lda, B, ldb, beta, C + i * ldc, ldc);
  switch (M - i) {
    case 1: row_panel_f32<1, TRANS_A>(N, K, alpha, a_rows(i), lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 2: row_panel_f32<2, TRANS_A>(N, K, alpha, a_rows(i), lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 3: row_panel_f32<3, TRANS_A>(N, K, alpha, a_rows(i), lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 4: row_panel_f32<4, TRANS_A>(N, K, alpha, a_rows(i), lda, B, ldb, beta, C + i * ldc, ldc); break;
    case 5: row_panel_f32<5, TRANS_A>(N, K, alpha, a_rows(i), lda, B, ldb, beta, C + i * ldc, ldc); break;
    default: break;
  }
}

#endif  // __AVX512F__

#if !defined(__AVX512F__)
// Portable fallback for builds without AVX-512 (HYLA_NATIVE=OFF).
void small_gemm_scalar(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                       const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : c[j] * beta;
    for (int64_t k = 0; k < K; ++k) {
      const float a = alpha * (trans_a ? A[k * lda + i] : A[i * lda + k]);
      const float* b = B + k * ldb;
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}
#endif


#if defined(__AVX512BF16__) && defined(__AVX512BW__)

// Packs rows r and r+1 of a rows×cols f32 block (row stride ld) into 32-bit bf16 pairs,
// dst[p * cols + c] = (x[2p][c], x[2p+1][c]); an odd last row is paired with zero.
void pack_row_pairs(const float* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* dst, int64_t dst_cols) {
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                              6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t p = 0; p < (rows + 1) / 2; ++p) {
    const float* r0 = x + 2 * p * ld;
    const float* r1 = 2 * p + 1 < rows ? r0 + ld : nullptr;
    for (int64_t c = 0; c < dst_cols; c += 16) {
      const __mmask16 m = tail_mask(std::max<int64_t>(0, cols - c));
      const __m512 lo = _mm512_maskz_loadu_ps(m, r0 + c);
      const __m512 hi = r1 ? _mm512_maskz_loadu_ps(m, r1 + c) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // [lo 0..15 | hi 0..15]
      _mm512_storeu_si512(dst + p * dst_cols + c, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// Rounds each row of an rows×cols block to bf16; with cols padded to even the pairs
// (x[r][2p], x[r][2p+1]) are adjacent 32-bit words.
void pack_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, uint16_t* dst, int64_t dst_cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dst_cols; c += 32) {
      const __mmask16 m0 = tail_mask(std::max<int64_t>(0, cols - c)), m1 = tail_mask(std::max<int64_t>(0, cols - c - 16));
      const __m512 a = _mm512_maskz_loadu_ps(m0, x + r * ld + c), b = _mm512_maskz_loadu_ps(m1, x + r * ld + c + 16);
      const __m512i packed = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      const __mmask32 store = dst_cols - c >= 32 ? ~__mmask32(0) : __mmask32((1ull << (dst_cols - c)) - 1);
      _mm512_mask_storeu_epi16(dst + r * dst_cols + c, store, packed);
    }
}

// A pairs: a_pair(r, p) at A32[r * a_row + p * a_col] (32-bit words); B pairs: [p][16 v + lane].
template <int ROWS, int VECS>
void block_bf16(int64_t pairs, float alpha, const uint32_t* A32, int64_t a_row, int64_t a_col, const uint32_t* B32,
                int64_t ldb32, float beta, float* C, int64_t ldc, __mmask16 last) {
  __m512 acc[ROWS * VECS];
  vec::unroll<ROWS * VECS>([&](auto i) { acc[i] = _mm512_setzero_ps(); });
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh b[VECS];
    vec::unroll<VECS>([&](auto v) { b[v] = (__m512bh)_mm512_loadu_si512(B32 + p * ldb32 + 16 * v); });
    vec::unroll<ROWS>([&](auto r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(A32[r * a_row + p * a_col]));
      vec::unroll<VECS>([&](auto v) { acc[r * VECS + v] = _mm512_dpbf16_ps(acc[r * VECS + v], a, b[v]); });
    });
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  vec::unroll<ROWS * VECS>([&](auto i) {
    constexpr int r = i / VECS, v = i % VECS;
    float* c = C + r * ldc + 16 * v;
    const __mmask16 m = v + 1 < VECS ? __mmask16(0xffff) : last;
    __m512 out = _mm512_mul_ps(acc[i], va);
    if (beta != 0.0f) out = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, c), vb, out);
    _mm512_mask_storeu_ps(c, m, out);
  });
}

template <int ROWS>
void row_panel_bf16(int64_t N, int64_t pairs, float alpha, const uint32_t* A32, int64_t a_row, int64_t a_col,
                    const uint32_t* B32, int64_t ldb32, float beta, float* C, int64_t ldc) {
  int64_t j = 0;
  for (; j + 64 <= N; j += 64)
    block_bf16<ROWS, 4>(pairs, alpha, A32, a_row, a_col, B32 + j, ldb32, beta, C + j, ldc, 0xffff);
  const int64_t rest = N - j;
  if (rest == 0) return;
  const __mmask16 last = tail_mask(rest - (rest - 1) / 16 * 16);
  switch ((rest + 15) / 16) {
    case 1: block_bf16<ROWS, 1>(pairs, alpha, A32, a_row, a_col, B32 + j, ldb32, beta, C + j, ldc, last); break;
    case 2: block_bf16<ROWS, 2>(pairs, alpha, A32, a_row, a_col, B32 + j, ldb32, beta, C + j, ldc, last); break;
    case 3: block_bf16<ROWS, 3>(pairs, alpha, A32, a_row, a_col, B32 + j, ldb32, beta, C + j, ldc, last); break;
    default: block_bf16<ROWS, 4>(pairs, alpha, A32, a_row, a_col, B32 + j, ldb32, beta, C + j, ldc, last); break;
  }
}

// All of C, in panels of 6 rows.
void panels_bf16(int64_t M, int64_t N, int64_t pairs, float alpha, const uint32_t* a32, int64_t a_row, int64_t a_col,
                 const uint32_t* b32, int64_t ldb32, float beta, float* C, int64_t ldc) {
  constexpr int kRows = 6;
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows)
    row_panel_bf16<kRows>(N, pairs, alpha, a32 + i * a_row, a_row, a_col, b32, ldb32, beta, C + i * ldc, ldc);
  const uint32_t* at = a32 + i * a_row;
  float* ct = C + i * ldc;
  switch (M - i) {
    case 1: row_panel_bf16<1>(N, pairs, alpha, at, a_row, a_col, b32, ldb32, beta, ct, ldc); break;
    case 2: row_panel_bf16<2>(N, pairs, alpha, at, a_row, a_col, b32, ldb32, beta, ct, ldc); break;
    case 3: row_panel_bf16<3>(N, pairs, alpha, at, a_row, a_col, b32, ldb32, beta, ct, ldc); break;
    case 4: row_panel_bf16<4>(N, pairs, alpha, at, a_row, a_col, b32, ldb32, beta, ct, ldc); break;
    case 5: row_panel_bf16<5>(N, pairs, alpha, at, a_row, a_col, b32, ldb32, beta, ct, ldc); break;
    default: break;
  }
}

#endif  // __AVX512BF16__

}  // namespace

int64_t small_gemm_bf16_scratch(int64_t M, int64_t N, int64_t K) {
  const int64_t pairs = (K + 1) / 2;
  return 4 * (pairs * round_up(M, 16) + pairs * round_up(N, 16)) + 128;
}

void small_gemm_bf16(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc, void* scratch) {
  if (M <= 0 || N <= 0) return;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  const int64_t pairs = (K + 1) / 2, np = round_up(N, 16), mp = round_up(M, 16);
  uint32_t* b32 = static_cast<uint32_t*>(scratch);
  uint32_t* a32 = b32 + pairs * np;
  pack_row_pairs(B, K, N, ldb, b32, np);
  int64_t a_row, a_col;  // word strides of the packed A between rows r and pairs p
  if (trans_a) {
    pack_row_pairs(A, K, M, lda, a32, mp);  // a pair (r, p) at a32[p * mp + r]
    a_row = 1, a_col = mp;
  } else {
    pack_rows(A, M, K, lda, reinterpret_cast<uint16_t*>(a32), 2 * pairs);  // (r, p) at a32[r * pairs + p]
    a_row = pairs, a_col = 1;
  }
  panels_bf16(M, N, pairs, alpha, a32, a_row, a_col, b32, np, beta, C, ldc);
#else
  (void)scratch;
  // Without bf16 instructions: round the inputs exactly as the fast path does, multiply in f32.
  thread_local std::vector<float> a_rounded, b_rounded;
  if (K == 0) return small_gemm(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  a_rounded.assign(A, A + (trans_a ? (K - 1) * lda + M : (M - 1) * lda + K));
  b_rounded.assign(B, B + (K - 1) * ldb + N);
  for (float& x : a_rounded) x = to_f32(to_bf16(x));
  for (float& x : b_rounded) x = to_f32(to_bf16(x));
  small_gemm(trans_a, M, N, K, alpha, a_rounded.data(), lda, b_rounded.data(), ldb, beta, C, ldc);
#endif
}

void small_gemm_bf16_packed(int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                            const uint32_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  HYLA_ASSERT(K % 2 == 0 && lda % 2 == 0 && ldb % 16 == 0 && ldb >= N);
  if (M <= 0 || N <= 0) return;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  panels_bf16(M, N, K / 2, alpha, reinterpret_cast<const uint32_t*>(A), lda / 2, 1, B, ldb, beta, C, ldc);
#else
  // On Vec (two AVX2 registers, or plain floats): a block of up to 4 rows of A against 16 columns
  // of B, each pair of B's words widened once for every row. B's rows hold ldb ≥ N words, a
  // multiple of 16, so whole vectors of them are always readable.
  constexpr int kRows = 4;
  for (int64_t i0 = 0; i0 < M; i0 += kRows) {
    const int rows = int(std::min<int64_t>(kRows, M - i0));
    for (int64_t j = 0; j < N; j += vec::kLanes) {
      vec::Vec acc[kRows];
      vec::unroll<kRows>([&](auto r) { acc[r] = vec::zero(); });
      for (int64_t p = 0; p < K / 2; ++p) {
        vec::Vec lo, hi;
        vec::load_bf16_pairs(B + p * ldb + j, vec::kAll, lo, hi);
        vec::unroll<kRows>([&](auto r) {
          if (r >= rows) return;
          const bf16* a = A + (i0 + r) * lda + 2 * p;
          acc[r] = vec::fmadd(hi, vec::broadcast(to_f32(a[1])), vec::fmadd(lo, vec::broadcast(to_f32(a[0])), acc[r]));
        });
      }
      const vec::Mask columns = vec::lane_range(0, N - j);
      vec::unroll<kRows>([&](auto r) {
        if (r >= rows) return;
        float* c = C + (i0 + r) * ldc + j;
        const vec::Vec out = beta == 0.0f ? vec::broadcast(alpha) * acc[r]
                                          : vec::fmadd(vec::broadcast(alpha), acc[r], vec::broadcast(beta) * vec::load(c, columns));
        vec::store(c, out, columns);
      });
    }
  }
#endif
}

void pack_bf16_pairs(const float* x, int64_t rows, int64_t cols, int64_t ld, uint32_t* dst, int64_t ld_dst) {
  HYLA_ASSERT(ld_dst % 16 == 0 && ld_dst >= cols);
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  pack_row_pairs(x, rows, cols, ld, dst, ld_dst);
#else
  for (int64_t p = 0; p < (rows + 1) / 2; ++p)
    for (int64_t c = 0; c < ld_dst; ++c) {
      const uint32_t lo = c < cols ? to_bf16(x[2 * p * ld + c]).bits : 0u;
      const uint32_t hi = c < cols && 2 * p + 1 < rows ? to_bf16(x[(2 * p + 1) * ld + c]).bits : 0u;
      dst[p * ld_dst + c] = lo | hi << 16;
    }
#endif
}

void small_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#if defined(__AVX512F__)
  if (trans_a) small_gemm_f32<true>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else small_gemm_f32<false>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  small_gemm_scalar(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst, int64_t ld_dst) {
#if defined(__AVX512F__)
  // 16×16 tiles through an unpack/shuffle network; edge tiles with masked loads and stores.
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16) {
      const int64_t nr = std::min<int64_t>(16, rows - r0), nc = std::min<int64_t>(16, cols - c0);
      const __mmask16 load_mask = tail_mask(nc), store_mask = tail_mask(nr);
      __m512 r[16], t[16], u[16];
      for (int i = 0; i < 16; ++i)
        r[i] = i < nr ? _mm512_maskz_loadu_ps(load_mask, src + (r0 + i) * ld_src + c0) : _mm512_setzero_ps();
      for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      // u[4k + m] holds, in 128-bit lane l, column 4l + m of rows 4k..4k+3.
      for (int m = 0; m < 4; ++m) {
        const __m512 x0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88), x1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xdd);
        const __m512 y0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88),
                     y1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xdd);
        const __m512 out[4] = {_mm512_shuffle_f32x4(x0, y0, 0x88), _mm512_shuffle_f32x4(x1, y1, 0x88),
                               _mm512_shuffle_f32x4(x0, y0, 0xdd), _mm512_shuffle_f32x4(x1, y1, 0xdd)};
        for (int l = 0; l < 4; ++l) {
          const int col = 4 * l + m;
          if (col < nc) _mm512_mask_storeu_ps(dst + (c0 + col) * ld_dst + r0, store_mask, out[l]);
        }
      }
    }
#else
  constexpr int64_t kTile = 16;  // tiles keep both the reads and the writes within a few cache lines
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
    }
#endif
}

}  // namespace hyla
