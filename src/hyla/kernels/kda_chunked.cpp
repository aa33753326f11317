// The chunked paths (WY/UT form). For a chunk of L tokens starting from state S0, with
// Γ_i = Σ_{j<=i} g_j (per key channel):
//
//   A_ij = β_i Σ_c k_i[c] k_j[c] e^{Γ_i[c]-Γ_j[c]}    (i > j)      T = (I + A)^{-1}
//   P_ij =     Σ_c q_i[c] k_j[c] e^{Γ_i[c]-Γ_j[c]}    (i >= j)
//   W = T (β ⊙ K ⊙ e^Γ),  U = T (β ⊙ V),  E = U - W S0            (E_i = β_i e_i of the recurrence)
//   O = (Q ⊙ e^Γ) S0 + P E
//   S_L = diag(e^{Γ_L}) S0 + (K ⊙ e^{Γ_L - Γ})ᵀ E
//
// A and P are built in 16-token row blocks. Row block a uses the reference ref = Γ at its first
// token: rows contribute q_i ⊙ e^{Γ_i - ref} (<= 1) and columns k_j ⊙ e^{ref - Γ_j}. For j in
// earlier blocks that factor is <= 1; for j inside the block (the diagonal sub-block) it is
// >= 1 but at most e^{15·|lb|} under the lower-bounded gate, so the dense path computes the whole
// row block as one matrix product. The pairwise path (any gate) computes the diagonal
// sub-block pair by pair with e^{Γ_i - Γ_j}, i >= j, masked before exponentiating.
#include <algorithm>
#include <cstring>

#include "hyla/kernels/kda_internal.h"
#include "hyla/kernels/small_gemm.h"
#include "hyla/kernels/vmath.h"

namespace hyla {
namespace {

constexpr int64_t kSub = 16;  // sub-chunk (row block) size

// Matrix products inside one task: f32 or bf16-rounded inputs.
struct Mm {
  bool bf16;
  void* scratch;
  void operator()(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
      return;
    }
    if (bf16) small_gemm_bf16(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, scratch);
    else small_gemm(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
};

// The chunk's inputs gathered into contiguous rows, and the quantities shared by forward and backward.
struct Chunk {
  int64_t L;           // tokens in this chunk
  float *q, *k, *v;    // [L×K], [L×K], [L×V]
  float* beta;         // [L]
  double* G;           // Γ, [L×K]: in double so that differences Γ_i - Γ_j of large cumulative
                       // decays (the unbounded gate reaches thousands of nats) keep f32 accuracy
  double* GT;          // Γᵀ, [K×C]
  float* kT;           // kᵀ, [K×C]
  float* eG;           // e^Γ, [L×K]
  float* P;            // [C×C], lower triangle incl. diagonal
  float* A;            // Ã (A without the β row scaling), [C×C], strictly lower
  float* T;            // (I + A)^{-1}, [C×C], lower
  float* QW;           // rows [0, L): Q̂ = Q ⊙ e^Γ; rows [L, 2L): W; [2C×K]
  float* Xk;           // β ⊙ K ⊙ e^Γ, [L×K]
  float* Xv;           // β ⊙ V, [L×V]
  float* E;            // U - W S0, [L×V]
  float* Kt;           // K ⊙ e^{Γ_L - Γ}, [L×K]
  float* eKt;          // e^{Γ_L - Γ}, [L×K]
  float* eGL;          // e^{Γ_L}, [K]
  // Row-block scratch for the intra-chunk products: factors e^{Γ_i-ref} [16×K] and e^{ref-Γ_j}
  // [K×C], the products' inputs [qd ; kd] [2·16×K] and krT [K×C], and their output [2·16×C].
  float *ed, *ekr, *QKd, *krT, *PA;
  float* pair;         // e^{Γ_i - Γ_j} for one pair of the pairwise path, [K]
};

struct Dims {
  int64_t K, V, C;
  KdaStrides st;
};

Chunk take_chunk(KdaWorkspace::Thread& ws, const Dims& d) {
  const int64_t K = d.K, V = d.V, C = d.C;
  Chunk c{};
  c.q = ws.take(C * K), c.k = ws.take(C * K), c.v = ws.take(C * V), c.beta = ws.take(C);
  c.G = reinterpret_cast<double*>(ws.take(2 * C * K)), c.GT = reinterpret_cast<double*>(ws.take(2 * K * C));
  c.kT = ws.take(K * C), c.eG = ws.take(C * K);
  c.P = ws.take(C * C), c.A = ws.take(C * C), c.T = ws.take(C * C);
  c.QW = ws.take(2 * C * K), c.Xk = ws.take(C * K), c.Xv = ws.take(C * V), c.E = ws.take(C * V);
  c.Kt = ws.take(C * K), c.eKt = ws.take(C * K), c.eGL = ws.take(K);
  c.ed = ws.take(kSub * K), c.ekr = ws.take(K * C);
  c.QKd = ws.take(2 * kSub * K), c.krT = ws.take(K * C), c.PA = ws.take(2 * kSub * C), c.pair = ws.take(K);
  return c;
}

void gather(const KdaInputs& in, const Dims& d, int64_t h, int64_t row0, Chunk& c) {
  const int64_t K = d.K, V = d.V;
  for (int64_t i = 0; i < c.L; ++i) {
    const int64_t row = row0 + i;
    std::memcpy(c.q + i * K, in.q + row * d.st.qk + h * K, size_t(K) * 4);
    std::memcpy(c.k + i * K, in.k + row * d.st.qk + h * K, size_t(K) * 4);
    std::memcpy(c.v + i * V, in.v + row * d.st.v + h * V, size_t(V) * 4);
    c.beta[i] = in.beta[row * d.st.beta + h];
    const float* g = in.g + row * d.st.qk + h * K;
    for (int64_t j = 0; j < K; ++j) c.G[i * K + j] = (i ? c.G[(i - 1) * K + j] : 0.0) + double(g[j]);
  }
  for (int64_t j = 0; j < K; ++j)
    for (int64_t i = 0; i < c.L; ++i) c.GT[j * d.C + i] = c.G[i * K + j];
}

// Row block a's left factors [q ⊙ e^{Γ-ref} ; k ⊙ e^{Γ-ref}] and column factors
// krT[c][j] = k_j[c] e^{ref[c]-Γ_j[c]} for j < cols. Returns the largest column exponent.
float block_factors(Chunk& c, const Dims& d, int64_t r0, int64_t rows, int64_t cols) {
  const int64_t K = d.K, C = d.C;
  const double* ref = c.G + r0 * K;
  float* qd = c.QKd;
  float* kd = c.QKd + rows * K;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < K; ++j) c.ed[i * K + j] = float(c.G[(r0 + i) * K + j] - ref[j]);
  exp_inplace(c.ed, rows * K);
  for (int64_t x = 0; x < rows * K; ++x) {
    qd[x] = c.q[r0 * K + x] * c.ed[x];
    kd[x] = c.k[r0 * K + x] * c.ed[x];
  }
  float max_exponent = 0.0f;
  for (int64_t ch = 0; ch < K; ++ch) {
    float* e = c.ekr + ch * C;
    const double* gt = c.GT + ch * C;
    for (int64_t j = 0; j < cols; ++j) e[j] = float(ref[ch] - gt[j]);
    if (cols > 0) max_exponent = std::max(max_exponent, e[cols - 1]);  // Γ falls along j: the last is largest
    exp_inplace(e, cols);
    const float* kt = c.kT + ch * C;
    float* kr = c.krT + ch * C;
    for (int64_t j = 0; j < cols; ++j) kr[j] = kt[j] * e[j];
  }
  return max_exponent;
}

// e^{Γ_i - Γ_j} over the key channels, for i >= j (exponents <= 0).
const float* pair_decay(Chunk& c, int64_t K, int64_t i, int64_t j) {
  for (int64_t ch = 0; ch < K; ++ch) c.pair[ch] = float(c.G[i * K + ch] - c.G[j * K + ch]);
  exp_inplace(c.pair, K);
  return c.pair;
}

// P and Ã (and T) of a gathered chunk. Returns the largest dense exponent used.
float intra_chunk(Chunk& c, const Dims& d, bool pairwise, const Mm& mm) {
  const int64_t K = d.K, C = d.C, L = c.L;
  transpose(c.k, L, K, K, c.kT, C);
  std::fill(c.P, c.P + C * C, 0.0f);
  std::fill(c.A, c.A + C * C, 0.0f);
  float max_exponent = 0.0f;
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t rows = std::min(kSub, L - r0), r1 = r0 + rows;
    const int64_t cols = pairwise ? r0 : r1;  // columns computed as one product
    max_exponent = std::max(max_exponent, block_factors(c, d, r0, rows, cols));
    mm(false, 2 * rows, cols, K, 1.0f, c.QKd, K, c.krT, C, 0.0f, c.PA, C);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t gi = r0 + i;
      for (int64_t j = 0; j < cols; ++j) {
        if (j <= gi) c.P[gi * C + j] = c.PA[i * C + j];
        if (j < gi) c.A[gi * C + j] = c.PA[(rows + i) * C + j];
      }
    }
    if (!pairwise) continue;
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = r0; j <= i; ++j) {
        const float* e = pair_decay(c, K, i, j);
        float p = 0.0f, a = 0.0f;
        for (int64_t ch = 0; ch < K; ++ch) {
          p += c.q[i * K + ch] * c.k[j * K + ch] * e[ch];
          a += c.k[i * K + ch] * c.k[j * K + ch] * e[ch];
        }
        c.P[i * C + j] = p;
        if (j < i) c.A[i * C + j] = a;
      }
  }
  // T = (I + diag(β) Ã)^{-1} by forward substitution: T_i = e_i - Σ_{m<i} β_i Ã_im T_m.
  std::fill(c.T, c.T + C * C, 0.0f);
  for (int64_t i = 0; i < L; ++i) {
    float* ti = c.T + i * C;
    ti[i] = 1.0f;
    for (int64_t m = 0; m < i; ++m) {
      const float a = c.beta[i] * c.A[i * C + m];
      const float* tm = c.T + m * C;
      for (int64_t j = 0; j <= m; ++j) ti[j] -= a * tm[j];
    }
  }
  return max_exponent;
}

// Q̂, W, E, Kt and the decay factors; E = U - W S0 needs the chunk's start state.
void wy_form(Chunk& c, const Dims& d, const float* S0, const Mm& mm) {
  const int64_t K = d.K, V = d.V, C = d.C, L = c.L;
  for (int64_t x = 0; x < L * K; ++x) c.eG[x] = float(c.G[x]);
  exp_inplace(c.eG, L * K);
  float* Qh = c.QW;
  float* W = c.QW + L * K;
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < K; ++j) {
      Qh[i * K + j] = c.q[i * K + j] * c.eG[i * K + j];
      c.Xk[i * K + j] = c.beta[i] * c.k[i * K + j] * c.eG[i * K + j];
    }
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < V; ++j) c.Xv[i * V + j] = c.beta[i] * c.v[i * V + j];
  const double* GL = c.G + (L - 1) * K;
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < K; ++j) c.eKt[i * K + j] = float(GL[j] - c.G[i * K + j]);
  exp_inplace(c.eKt, L * K);
  for (int64_t i = 0; i < L * K; ++i) c.Kt[i] = c.k[i] * c.eKt[i];
  for (int64_t j = 0; j < K; ++j) c.eGL[j] = float(GL[j]);
  exp_inplace(c.eGL, K);
  // W = T Xk, U = T Xv, block row by block row (T is lower triangular).
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t rows = std::min(kSub, L - r0);
    mm(false, rows, K, r0 + rows, 1.0f, c.T + r0 * C, C, c.Xk, K, 0.0f, W + r0 * K, K);
    mm(false, rows, V, r0 + rows, 1.0f, c.T + r0 * C, C, c.Xv, V, 0.0f, c.E + r0 * V, V);
  }
  mm(false, L, V, K, -1.0f, W, K, S0, V, 1.0f, c.E, V);
}

// S ← diag(e^{Γ_L}) S + Ktᵀ E.
void advance_state(const Chunk& c, const Dims& d, float* S, const Mm& mm) {
  for (int64_t ch = 0; ch < d.K; ++ch)
    for (int64_t j = 0; j < d.V; ++j) S[ch * d.V + j] *= c.eGL[ch];
  mm(true, d.K, d.V, c.L, 1.0f, c.Kt, d.K, c.E, d.V, 1.0f, S, d.V);
}

void* mm_scratch(KdaWorkspace::Thread& ws, const Dims& d, bool bf16) {
  if (!bf16) return nullptr;
  const int64_t n = std::max({d.K, d.V, d.C}), big = std::max(2 * d.C, n);
  return ws.take((small_gemm_bf16_scratch(big, n, big) + 3) / 4);
}

}  // namespace

void kda_chunked_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                              int64_t h, float* o, float* final_state, KdaSavedStates* saved,
                              KdaWorkspace::Thread& ws) {
  const Dims d{shape.key_dim, shape.value_dim, options.chunk_size, strides(shape)};
  const int64_t K = d.K, V = d.V;
  const bool pairwise = options.path == KdaPath::ChunkedPairwise;
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  float* S = ws.take(K * V);
  float* O = ws.take(d.C * V);
  Chunk c = take_chunk(ws, d);
  const Mm mm{options.bf16_matmul, mm_scratch(ws, d, options.bf16_matmul)};
  if (in.initial_state) std::memcpy(S, in.initial_state + (b * shape.heads + h) * K * V, size_t(K * V) * 4);
  else std::fill(S, S + K * V, 0.0f);

  for (int64_t t0 = 0; t0 < len; t0 += d.C) {
    c.L = std::min(d.C, len - t0);
    if (saved) std::memcpy(saved_state(*saved, shape, b, t0 / d.C, h), S, size_t(K * V) * 4);
    gather(in, d, h, first + t0, c);
    const float exponent = intra_chunk(c, d, pairwise, mm);
    if (!pairwise) ws.max_dense_exponent = std::max(ws.max_dense_exponent, exponent);
    wy_form(c, d, S, mm);
    // O = Q̂ S0 + P E.
    mm(false, c.L, V, K, 1.0f, c.QW, K, S, V, 0.0f, O, V);
    for (int64_t r0 = 0; r0 < c.L; r0 += kSub) {
      const int64_t rows = std::min(kSub, c.L - r0);
      mm(false, rows, V, r0 + rows, 1.0f, c.P + r0 * d.C, d.C, c.E, V, 1.0f, O + r0 * V, V);
    }
    for (int64_t i = 0; i < c.L; ++i)
      std::memcpy(o + (first + t0 + i) * d.st.v + h * V, O + i * V, size_t(V) * 4);
    advance_state(c, d, S, mm);
  }
  if (final_state) std::memcpy(final_state + (b * shape.heads + h) * K * V, S, size_t(K * V) * 4);
  ws.release();
}

void kda_chunked_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                               int64_t h, const float* d_o, const float* d_final_state, const KdaSavedStates& saved,
                               const KdaGrads& grads, KdaWorkspace::Thread& ws) {
  const Dims d{shape.key_dim, shape.value_dim, options.chunk_size, strides(shape)};
  const int64_t K = d.K, V = d.V, C = d.C;
  const bool pairwise = options.path == KdaPath::ChunkedPairwise;
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  Chunk c = take_chunk(ws, d);
  const Mm mm{options.bf16_matmul, mm_scratch(ws, d, options.bf16_matmul)};
  float* dS = ws.take(K * V);       // dL/d(state at the chunk's end), then at its start
  float* dS0 = ws.take(K * V);
  float* S0T = ws.take(V * K);
  float* dST = ws.take(V * K);
  float* DOE = ws.take(2 * C * V);  // rows [0, L): dO; rows [L, 2L): -dE
  float* dE = ws.take(C * V);
  float* ET = ws.take(V * C);
  float* dP = ws.take(C * C);
  float* dA = ws.take(C * C);
  float* dT = ws.take(C * C);
  float* TT = ws.take(C * C);
  float* M1 = ws.take(C * C);
  float* dQW = ws.take(2 * C * K);  // rows [0, L): dQ̂; rows [L, 2L): dW
  float* dKt = ws.take(C * K);
  float* dXk = ws.take(C * K);
  float* dXv = ws.take(C * V);
  float* XkT = ws.take(K * C);
  float* XvT = ws.take(V * C);
  float* dq = ws.take(C * K);
  float* dk = ws.take(C * K);
  float* dG = ws.take(C * K);
  float* dkT = ws.take(K * C);
  float* dGT = ws.take(K * C);
  float* dbeta = ws.take(C);
  float* dGL = ws.take(K);
  float* dref = ws.take(K);
  float* dPA = ws.take(2 * kSub * C);
  float* dQKd = ws.take(2 * kSub * K);
  float* dkrT = ws.take(K * C);
  float* kr = ws.take(C * K);

  if (d_final_state) std::memcpy(dS, d_final_state + (b * shape.heads + h) * K * V, size_t(K * V) * 4);
  else std::fill(dS, dS + K * V, 0.0f);

  for (int64_t t0 = len <= 0 ? -1 : (len - 1) / C * C; t0 >= 0; t0 -= C) {
    c.L = std::min(C, len - t0);
    const int64_t L = c.L, row0 = first + t0;
    const float* S0 = saved_state(saved, shape, b, t0 / C, h);
    gather(in, d, h, row0, c);
    intra_chunk(c, d, pairwise, mm);
    wy_form(c, d, S0, mm);
    for (int64_t i = 0; i < L; ++i) std::memcpy(DOE + i * V, d_o + (row0 + i) * d.st.v + h * V, size_t(V) * 4);
    const float* dO = DOE;

    // S_L = diag(e^{Γ_L}) S0 + Ktᵀ E.
    mm(false, L, V, K, 1.0f, c.Kt, K, dS, V, 0.0f, dE, V);
    transpose(dS, K, V, V, dST, K);
    mm(false, L, K, V, 1.0f, c.E, V, dST, K, 0.0f, dKt, K);
    for (int64_t ch = 0; ch < K; ++ch) {
      float s = 0.0f;
      for (int64_t j = 0; j < V; ++j) {
        s += S0[ch * V + j] * dS[ch * V + j];
        dS0[ch * V + j] = c.eGL[ch] * dS[ch * V + j];
      }
      dGL[ch] = c.eGL[ch] * s;
    }
    // O = Q̂ S0 + P E.
    transpose(c.E, L, V, V, ET, C);
    mm(false, L, L, V, 1.0f, dO, V, ET, C, 0.0f, dP, C);
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = i + 1; j < L; ++j) dP[i * C + j] = 0.0f;
    mm(true, L, V, L, 1.0f, c.P, C, dO, V, 1.0f, dE, V);
    // E = U - W S0: [dQ̂ ; dW] = [dO ; -dE] S0ᵀ and dS0 += [Q̂ ; W]ᵀ [dO ; -dE].
    for (int64_t i = 0; i < L * V; ++i) DOE[L * V + i] = -dE[i];
    transpose(S0, K, V, V, S0T, K);
    mm(false, 2 * L, K, V, 1.0f, DOE, V, S0T, K, 0.0f, dQW, K);
    mm(true, K, V, 2 * L, 1.0f, c.QW, K, DOE, V, 1.0f, dS0, V);
    const float* dQh = dQW;
    const float* dW = dQW + L * K;
    // [W | U] = T [Xk | Xv]: dX = Tᵀ [dW | dU], dT = dW Xkᵀ + dU Xvᵀ (dU = dE).
    mm(true, L, K, L, 1.0f, c.T, C, dW, K, 0.0f, dXk, K);
    mm(true, L, V, L, 1.0f, c.T, C, dE, V, 0.0f, dXv, V);
    transpose(c.Xk, L, K, K, XkT, C);
    transpose(c.Xv, L, V, V, XvT, C);
    mm(false, L, L, K, 1.0f, dW, K, XkT, C, 0.0f, dT, C);
    mm(false, L, L, V, 1.0f, dE, V, XvT, C, 1.0f, dT, C);
    // T = (I + A)^{-1}: dA = -Tᵀ dT Tᵀ on the strictly lower triangle.
    transpose(c.T, L, L, C, TT, C);
    mm(false, L, L, L, 1.0f, dT, C, TT, C, 0.0f, M1, C);
    mm(true, L, L, L, -1.0f, c.T, C, M1, C, 0.0f, dA, C);

    std::fill(dq, dq + L * K, 0.0f);
    std::fill(dk, dk + L * K, 0.0f);
    std::fill(dG, dG + L * K, 0.0f);
    std::fill(dkT, dkT + K * C, 0.0f);
    std::fill(dGT, dGT + K * C, 0.0f);
    for (int64_t i = 0; i < L; ++i) {
      // Xk = β K e^Γ, Xv = β V; Q̂ = Q e^Γ; Kt = K e^{Γ_L - Γ}.
      float db = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t x = i * K + j;
        db += dXk[x] * c.k[x] * c.eG[x];
        dk[x] += c.beta[i] * dXk[x] * c.eG[x] + dKt[x] * c.eKt[x];
        dG[x] += dXk[x] * c.Xk[x] + dQh[x] * c.QW[x] - dKt[x] * c.Kt[x];
        dq[x] += dQh[x] * c.eG[x];
      }
      for (int64_t j = 0; j < V; ++j) {
        db += dXv[i * V + j] * c.v[i * V + j];
        grads.dv[(row0 + i) * d.st.v + h * V + j] = c.beta[i] * dXv[i * V + j];
      }
      // A = diag(β) Ã.
      for (int64_t j = 0; j < i; ++j) {
        db += dA[i * C + j] * c.A[i * C + j];
        dA[i * C + j] *= c.beta[i];
      }
      for (int64_t j = i; j < C; ++j) dA[i * C + j] = 0.0f;
      dbeta[i] = db;
    }
    for (int64_t j = 0; j < K; ++j) {
      float s = 0.0f;
      for (int64_t i = 0; i < L; ++i) s += dKt[i * K + j] * c.Kt[i * K + j];
      dGL[j] += s;
    }

    // Back through the row-block products [P ; Ã] = [qd ; kd] · krT.
    for (int64_t r0 = 0; r0 < L; r0 += kSub) {
      const int64_t rows = std::min(kSub, L - r0), r1 = r0 + rows;
      const int64_t cols = pairwise ? r0 : r1;
      if (cols > 0) {
        block_factors(c, d, r0, rows, cols);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            dPA[i * C + j] = dP[(r0 + i) * C + j];
            dPA[(rows + i) * C + j] = dA[(r0 + i) * C + j];
          }
        transpose(c.krT, K, cols, C, kr, K);
        mm(false, 2 * rows, K, cols, 1.0f, dPA, C, kr, K, 0.0f, dQKd, K);
        mm(true, K, cols, 2 * rows, 1.0f, c.QKd, K, dPA, C, 0.0f, dkrT, C);
        std::fill(dref, dref + K, 0.0f);
        for (int64_t i = 0; i < rows; ++i) {
          const float* qd = c.QKd + i * K;
          const float* kd = c.QKd + (rows + i) * K;
          const float* dqd = dQKd + i * K;
          const float* dkd = dQKd + (rows + i) * K;
          const float* e = c.ed + i * K;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t x = (r0 + i) * K + j;
            dq[x] += dqd[j] * e[j];
            dk[x] += dkd[j] * e[j];
            const float s = dqd[j] * qd[j] + dkd[j] * kd[j];
            dG[x] += s;
            dref[j] -= s;
          }
        }
        for (int64_t ch = 0; ch < K; ++ch)
          for (int64_t j = 0; j < cols; ++j) {
            const float s = dkrT[ch * C + j] * c.krT[ch * C + j];
            dkT[ch * C + j] += dkrT[ch * C + j] * c.ekr[ch * C + j];
            dGT[ch * C + j] -= s;
            dref[ch] += s;
          }
        for (int64_t j = 0; j < K; ++j) dG[r0 * K + j] += dref[j];
      }
      if (!pairwise) continue;
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = r0; j <= i; ++j) {
          const float dp = dP[i * C + j], da = j < i ? dA[i * C + j] : 0.0f;
          const float* e = pair_decay(c, K, i, j);
          for (int64_t ch = 0; ch < K; ++ch) {
            const float qi = c.q[i * K + ch], ki = c.k[i * K + ch], kj = c.k[j * K + ch];
            dq[i * K + ch] += dp * kj * e[ch];
            dk[j * K + ch] += (dp * qi + da * ki) * e[ch];
            dk[i * K + ch] += da * kj * e[ch];
            const float s = (dp * qi + da * ki) * kj * e[ch];
            dG[i * K + ch] += s;
            dG[j * K + ch] -= s;
          }
        }
    }
    for (int64_t ch = 0; ch < K; ++ch)
      for (int64_t j = 0; j < L; ++j) {
        dk[j * K + ch] += dkT[ch * C + j];
        dG[j * K + ch] += dGT[ch * C + j];
      }
    for (int64_t j = 0; j < K; ++j) dG[(L - 1) * K + j] += dGL[j];
    // Γ = cumsum(g): dg_j = Σ_{i >= j} dΓ_i.
    for (int64_t i = L - 2; i >= 0; --i)
      for (int64_t j = 0; j < K; ++j) dG[i * K + j] += dG[(i + 1) * K + j];
    for (int64_t i = 0; i < L; ++i) {
      const int64_t row = row0 + i;
      std::memcpy(grads.dq + row * d.st.qk + h * K, dq + i * K, size_t(K) * 4);
      std::memcpy(grads.dk + row * d.st.qk + h * K, dk + i * K, size_t(K) * 4);
      std::memcpy(grads.dg + row * d.st.qk + h * K, dG + i * K, size_t(K) * 4);
      grads.dbeta[row * d.st.beta + h] = dbeta[i];
    }
    std::swap(dS, dS0);
  }
  if (grads.d_initial_state) std::memcpy(grads.d_initial_state + (b * shape.heads + h) * K * V, dS, size_t(K * V) * 4);
  ws.release();
}

}  // namespace hyla
