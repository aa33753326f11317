#include "hyla/kernels/skinny_gemm.h"

#include <algorithm>
#include <cstring>

#include "hyla/core/error.h"
#include "hyla/core/team.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/cpu/vec.h"

namespace hyla {

namespace {

using vec::Vec;

// One operand vector of each input type, loading `n` ≤ kWidth values (the rest read as zeros).
struct F32Ops {
  using T = float;
  using Operand = Vec;
  static constexpr int kWidth = vec::kLanes;
  static Operand load(const float* p) { return vec::load(p); }
  static Operand load(const float* p, int64_t n) { return vec::load(p, vec::lane_range(0, n)); }
  static Vec madd(Vec acc, Operand w, Operand x) { return vec::fmadd(w, x, acc); }
};

struct Bf16Ops {
  using T = bf16;
  static constexpr int kWidth = 2 * vec::kLanes;
#if defined(__AVX512BF16__)
  // 32 bf16 as 16 pairs: one vdpbf16ps adds both products of each pair to its f32 lane.
  using Operand = __m512bh;
  static Operand load(const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static Operand load(const bf16* p, int64_t n) {
    return (__m512bh)_mm512_maskz_loadu_epi16(n >= 32 ? ~0u : (1u << n) - 1u, p);
  }
  static Vec madd(Vec acc, Operand w, Operand x) { return _mm512_dpbf16_ps(acc, w, x); }
#else
  struct Operand {
    Vec lo, hi;
  };
  static Operand load(const bf16* p) { return {vec::load_bf16(p), vec::load_bf16(p + vec::kLanes)}; }
  static Operand load(const bf16* p, int64_t n) {
    return {vec::load_bf16(p, vec::lane_range(0, n)), vec::load_bf16(p + vec::kLanes, vec::lane_range(0, n - vec::kLanes))};
  }
  static Vec madd(Vec acc, Operand w, Operand x) { return vec::fmadd(w.hi, x.hi, vec::fmadd(w.lo, x.lo, acc)); }
#endif
};

// How skinny_rows walks the weights, tuned per microarchitecture at compile time like the
// instruction set (-march=native; GCC names AMD's Zen cores __znverN__, Zen 5 as znver3 with
// AVX-512 in GCC 12). Measured with one thread on products of configs/small.json's shapes
// (BENCHMARKS.md, "Decode products on Zen 5"):
// - Xeon (Sapphire Rapids class): four rows at a time with the next group prefetched into L2,
//   1.10x faster than without on a token's products in L3 and DRAM.
// - Zen 5: the prefetch costs 10-15% in L3 and gains nothing from DRAM, and each row's
//   reduction and x's reloads take scheduler room that the weight loads need: eight rows at a
//   time without the prefetch read 1.1-1.3x faster for one row of x.
template <int M>
struct Layout {
#if defined(__znver1__) || defined(__znver2__) || defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
  static constexpr int kRows = M == 1 ? 8 : 4;
  static constexpr bool kPrefetch = false;
#else
  static constexpr int kRows = 4;
  static constexpr bool kPrefetch = true;
#endif
};

// Rows [n0, n1) of y for M rows of x, R = Layout's rows at a time, K unrolled U = 16 / (R·M) times
// so that up to 16 accumulators are in flight: accumulator (r·M + m)·U + u sums x[m] · W[n + r]
// over the u-th vector of each step. A group past N re-reads the last row and does not store it.
// With Layout's prefetch every weight vector read prefetches the same offset of the next group
// into L2; the prefetch past the last group reads nothing the caller owns but faults never.
template <class Ops, int M>
void skinny_rows(int64_t n0, int64_t n1, int64_t N, int64_t K, float alpha, const typename Ops::T* x, int64_t ldx,
                 const typename Ops::T* W, int64_t ldw, float beta, float* y, int64_t ldy) {
  constexpr int R = Layout<M>::kRows;
  static_assert(R * M <= 16);
  constexpr int U = std::max(1, 16 / (R * M)), W_ = Ops::kWidth, kStep = U * W_;
  const int64_t full = K / kStep * kStep;
  for (int64_t n = n0; n < n1; n += R) {
    Vec acc[R * M * U];
    vec::unroll<R * M * U>([&](auto i) { acc[i] = vec::zero(); });
    const typename Ops::T* rows[R];
    vec::unroll<R>([&](auto r) { rows[r] = W + std::min<int64_t>(n + r, N - 1) * ldw; });
    for (int64_t k = 0; k < full; k += kStep) {
      typename Ops::Operand xv[M * U];
      vec::unroll<M * U>([&](auto i) { xv[i] = Ops::load(x + (i / U) * ldx + k + (i % U) * W_); });
      vec::unroll<R * U>([&](auto i) {
        constexpr int r = i / U, u = i % U;
        if constexpr (Layout<M>::kPrefetch) __builtin_prefetch(rows[r] + R * ldw + k + u * W_, 0, 2);  // into L2
        const auto w = Ops::load(rows[r] + k + u * W_);
        vec::unroll<M>([&](auto m) { acc[(r * M + m) * U + u] = Ops::madd(acc[(r * M + m) * U + u], w, xv[m * U + u]); });
      });
    }
    for (int64_t k = full; k < K; k += W_) {  // the last partial step, one vector at a time
      vec::unroll<R>([&](auto r) {
        const auto w = Ops::load(rows[r] + k, K - k);
        vec::unroll<M>([&](auto m) {
          acc[(r * M + m) * U] = Ops::madd(acc[(r * M + m) * U], w, Ops::load(x + m * ldx + k, K - k));
        });
      });
    }
    Vec totals[16];
    vec::unroll<16>([&](auto i) {
      if constexpr (i < R * M) {
        totals[i] = acc[i * U];
        vec::unroll<U - 1>([&](auto u) { totals[i] = totals[i] + acc[i * U + u + 1]; });
      } else {
        totals[i] = vec::zero();
      }
    });
    float sums[16];
    vec::store(sums, vec::sum_each(totals));
    for (int r = 0; r < R && n + r < n1; ++r)
      for (int m = 0; m < M; ++m) {
        float& out = y[m * ldy + n + r];
        out = alpha * sums[r * M + m] + (beta == 0.0f ? 0.0f : beta * out);
      }
  }
}

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)

// AVX2 has 16 ymm registers, and skinny_rows on two-register Vecs wants 32 (16 accumulators of
// two registers each): it spilled, and read weights at 5–8 GB/s (bf16) of a 23 GB/s stream. Here
// a step of K is 16 values in two registers and at most 8 accumulators are in flight (FMA's
// latency × its two ports).
namespace avx2 {

// 16 values as two f32 registers: consecutive halves for f32; for bf16 the even and the odd
// elements, widened by a shift and a mask of each 32-bit pair (no shuffle). x is split the same
// way, so every lane still multiplies a weight by its own x.
inline void split(const float* p, __m256& a, __m256& b) {
  a = _mm256_loadu_ps(p);
  b = _mm256_loadu_ps(p + 8);
}
inline void split(const bf16* p, __m256& a, __m256& b) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  a = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  b = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xffff0000u))));
}
// The last n < 16 values, the rest zero, through a copy so that nothing past them is read.
template <typename T>
void split_tail(const T* p, int64_t n, __m256& a, __m256& b) {
  alignas(32) unsigned char part[16 * sizeof(T)] = {};
  std::memcpy(part, p, size_t(n) * sizeof(T));
  split(reinterpret_cast<const T*>(part), a, b);
}

inline float sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

// One weight row at a time, so that W is read as one sequential stream (rows of a product lie
// back to back): four rows side by side, as skinny_rows reads them, are four streams of 1 KB each
// for a 512-wide bf16 row, too short for the hardware prefetcher, and read at ~60% of this speed
// here. U steps of 16 in flight keep 2·M·U accumulators. (A software prefetch 0.5–4 KB ahead
// in the stream measured the same as none.)
template <typename T, int M, int U>
void rows(int64_t n0, int64_t n1, int64_t K, float alpha, const T* x, int64_t ldx, const T* W, int64_t ldw, float beta,
          float* y, int64_t ldy) {
  constexpr int64_t kIteration = 16 * U;
  const int64_t unrolled = K / kIteration * kIteration, full = K / 16 * 16;
  for (int64_t n = n0; n < n1; ++n) {
    const T* w = W + n * ldw;
    __m256 acc[2 * M * U];
    vec::unroll<2 * M * U>([&](auto i) { acc[i] = _mm256_setzero_ps(); });
    // Step u of an iteration: 16 values of K at k into accumulators 2·(m·U + u) and the next one.
    const auto step = [&](int u, auto&& load_x, auto&& load_w) {
      __m256 wa, wb;
      load_w(wa, wb);
      vec::unroll<M>([&](auto m) {
        __m256 xa, xb;
        load_x(int(m), xa, xb);
        acc[2 * (m * U + u)] = _mm256_fmadd_ps(wa, xa, acc[2 * (m * U + u)]);
        acc[2 * (m * U + u) + 1] = _mm256_fmadd_ps(wb, xb, acc[2 * (m * U + u) + 1]);
      });
    };
    for (int64_t k = 0; k < unrolled; k += kIteration) {
      vec::unroll<U>([&](auto u) {
        const int64_t at = k + 16 * u;
        step(int(u), [&](int m, __m256& a, __m256& b) { split(x + m * ldx + at, a, b); },
             [&](__m256& a, __m256& b) { split(w + at, a, b); });
      });
    }
    for (int64_t k = unrolled; k < full; k += 16)
      step(0, [&](int m, __m256& a, __m256& b) { split(x + m * ldx + k, a, b); },
           [&](__m256& a, __m256& b) { split(w + k, a, b); });
    if (full < K)
      step(0, [&](int m, __m256& a, __m256& b) { split_tail(x + m * ldx + full, K - full, a, b); },
           [&](__m256& a, __m256& b) { split_tail(w + full, K - full, a, b); });
    for (int m = 0; m < M; ++m) {
      __m256 total = acc[2 * m * U];
      for (int i = 1; i < 2 * U; ++i) total = _mm256_add_ps(total, acc[2 * m * U + i]);
      float& out = y[m * ldy + n];
      out = alpha * sum(total) + (beta == 0.0f ? 0.0f : beta * out);
    }
  }
}

}  // namespace avx2

#endif

template <class Ops>
void skinny(int64_t M, int64_t N, int64_t K, float alpha, const typename Ops::T* x, int64_t ldx,
            const typename Ops::T* W, int64_t ldw, float beta, float* y, int64_t ldy) {
  HYLA_ASSERT(M >= 0 && M <= kSkinnyMaxRows);
  if (M == 0 || N == 0) return;
  // Pieces of whole 16-row groups, a few per thread so that a thread that arrives late finds work
  // taken rather than waiting to be taken; small products run on one thread, where waking the
  // team would cost more than the product.
  const int64_t groups = (N + 15) / 16;
  const bool parallel = N * K >= (int64_t(1) << 15) && groups > 1;
  const int64_t grain = parallel ? std::max<int64_t>(1, groups / (4 * num_threads())) : groups;
  parallel_for(groups, grain, [&](int, int64_t g0, int64_t g1) {
    const int64_t n0 = std::min(N, g0 * 16), n1 = std::min(N, g1 * 16);
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
    using T = typename Ops::T;
    switch (M) {
      case 1: avx2::rows<T, 1, 4>(n0, n1, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      case 2: avx2::rows<T, 2, 2>(n0, n1, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      case 3: avx2::rows<T, 3, 1>(n0, n1, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      default: avx2::rows<T, 4, 1>(n0, n1, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
    }
#else
    switch (M) {
      case 1: skinny_rows<Ops, 1>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      case 2: skinny_rows<Ops, 2>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      case 3: skinny_rows<Ops, 3>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      default: skinny_rows<Ops, 4>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
    }
#endif
  });
}

}  // namespace

void skinny_gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* x, int64_t ldx, const float* W,
                 int64_t ldw, float beta, float* y, int64_t ldy) {
  skinny<F32Ops>(M, N, K, alpha, x, ldx, W, ldw, beta, y, ldy);
}

void skinny_gemm(int64_t M, int64_t N, int64_t K, float alpha, const bf16* x, int64_t ldx, const bf16* W,
                 int64_t ldw, float beta, float* y, int64_t ldy) {
  skinny<Bf16Ops>(M, N, K, alpha, x, ldx, W, ldw, beta, y, ldy);
}

void skinny_gemm_kn(int64_t M, int64_t N, int64_t K, float alpha, const float* x, int64_t ldx, const float* W,
                    int64_t ldw, float beta, float* y, int64_t ldy) {
  HYLA_ASSERT(M >= 0 && M <= kSkinnyMaxRows);
  constexpr int64_t kVectors = 8;  // output values per pass: 8 accumulators a row of x
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n0 = 0; n0 < N; n0 += kVectors * vec::kLanes) {
      Vec acc[kVectors];
      vec::unroll<kVectors>([&](auto j) { acc[j] = vec::zero(); });
      const int64_t width = std::min(N - n0, kVectors * vec::kLanes);
      const int64_t whole = width / vec::kLanes;
      for (int64_t k = 0; k < K; ++k) {
        const Vec xk = vec::broadcast(x[m * ldx + k]);
        const float* w = W + k * ldw + n0;
        vec::unroll<kVectors>([&](auto j) {
          const float* at = w + j * vec::kLanes;
          if (j < whole) acc[j] = vec::fmadd(xk, vec::load(at), acc[j]);
          else if (j == whole && whole * vec::kLanes < width)
            acc[j] = vec::fmadd(xk, vec::load(at, vec::lane_range(0, width - j * vec::kLanes)), acc[j]);
        });
      }
      float* out = y + m * ldy + n0;
      vec::unroll<kVectors>([&](auto j) {
        if (j * vec::kLanes >= width) return;
        const vec::Mask mask = vec::lane_range(0, std::min<int64_t>(vec::kLanes, width - j * vec::kLanes));
        Vec v = vec::broadcast(alpha) * acc[j];
        if (beta != 0.0f) v = vec::fmadd(vec::broadcast(beta), vec::load(out + j * vec::kLanes, mask), v);
        vec::store(out + j * vec::kLanes, v, mask);
      });
    }
}

}  // namespace hyla
