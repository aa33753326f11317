#include "hyla/kernels/skinny_gemm.h"

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/core/team.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/vec.h"

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

// Rows [n0, n1) of y for M rows of x, four weight rows at a time (four sequential streams keep
// the hardware prefetchers ahead), K unrolled U = 4 / M times so that 16 accumulators are in
// flight: accumulator (r·M + m)·U + u sums x[m] · W[n + r] over the u-th vector of each step. A
// group past N re-reads the last row and does not store it.
template <class Ops, int M>
void skinny_rows(int64_t n0, int64_t n1, int64_t N, int64_t K, float alpha, const typename Ops::T* x, int64_t ldx,
                 const typename Ops::T* W, int64_t ldw, float beta, float* y, int64_t ldy) {
  constexpr int R = 4, U = M == 1 ? 4 : M == 2 ? 2 : 1, W_ = Ops::kWidth, kStep = U * W_;
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
    switch (M) {
      case 1: skinny_rows<Ops, 1>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      case 2: skinny_rows<Ops, 2>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      case 3: skinny_rows<Ops, 3>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
      default: skinny_rows<Ops, 4>(n0, n1, N, K, alpha, x, ldx, W, ldw, beta, y, ldy); break;
    }
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

}  // namespace hyla
