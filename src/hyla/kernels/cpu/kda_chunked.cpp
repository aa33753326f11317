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

#include "hyla/kernels/cpu/kda_internal.h"
#include "hyla/kernels/cpu/vmath.h"
#include "hyla/kernels/small_gemm.h"

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

// The chunk's inputs (views into the token-major inputs, row stride ld) and the quantities
// shared by forward and backward.
struct Chunk {
  int64_t L;                 // tokens in this chunk
  const float *q, *k, *v;    // rows i at q + i·ldqk (likewise k) and v + i·ldv
  int64_t ldqk, ldv;
  float* beta;               // [L]
  double* G;                 // Γ, [L×K], in double so that differences Γ_i - Γ_j of large cumulative
                             // decays (the unbounded gate reaches thousands of nats) keep f32 accuracy
  float* eG;                 // e^Γ, [L×K]
  float* P;                  // [C×C], lower triangle incl. diagonal
  float* A;                  // Ã (A without the β row scaling), [C×C], strictly lower
  float* T;                  // (I + A)^{-1}, [C×C], lower
  float* QW;                 // rows [0, L): Q̂ = Q ⊙ e^Γ; rows [L, 2L): W; [2C×K]
  float* Xk;                 // β ⊙ K ⊙ e^Γ, [L×K]
  float* Xv;                 // β ⊙ V, [L×V]
  float* E;                  // U - W S0, [L×V]
  float* Kt;                 // K ⊙ e^{Γ_L - Γ}, [L×K]
  float* eKt;                // e^{Γ_L - Γ}, [L×K]
  float* eGL;                // e^{Γ_L}, [K]
  // Row block scratch: e^{Γ_i - ref} [16×K]; [qd ; kd] [2·16×K] and its transpose [K×2·16];
  // e^{ref - Γ_j} and kr_j = k_j ⊙ e^{ref - Γ_j} for the block's columns [C×K]; [P ; Ã]ᵀ of the
  // block [C×2·16].
  float *ed, *QKd, *QKdT, *ekr, *kr, *PAT;
  float* pair;               // [K] scratch: e^{Γ_i - Γ_j} of a pair, or a row block's e^{ref}
  float* Ttmp;               // [2·16×C] scratch of the blocked inverse
};

struct Dims {
  int64_t K, V, C;    // V: the task's state columns
  KdaStrides st;
  int64_t v_full;     // the states' full width (their row stride)
  int64_t v0;         // the task's first column
  int64_t v_offset(int64_t h) const { return h * v_full + v0; }         // within an input row
  int64_t state_offset(int64_t h) const { return h * K * v_full + v0; }  // within a sequence's [H, K, V]
};

Dims make_dims(const KdaShape& shape, const KdaOptions& options, const KdaTask& task) {
  return {shape.key_dim, task.width, options.chunk_size, strides(shape), shape.value_dim, task.v0};
}

Chunk take_chunk(Arena& ws, const Dims& d) {
  const int64_t K = d.K, V = d.V, C = d.C;
  Chunk c{};
  c.ldqk = d.st.qk, c.ldv = d.st.v;
  c.beta = ws.take<float>(C), c.G = ws.take<double>(C * K), c.eG = ws.take<float>(C * K);
  c.P = ws.take<float>(C * C), c.A = ws.take<float>(C * C), c.T = ws.take<float>(C * C);
  c.QW = ws.take<float>(2 * C * K), c.Xk = ws.take<float>(C * K), c.Xv = ws.take<float>(C * V), c.E = ws.take<float>(C * V);
  c.Kt = ws.take<float>(C * K), c.eKt = ws.take<float>(C * K), c.eGL = ws.take<float>(K);
  c.ed = ws.take<float>(kSub * K), c.QKd = ws.take<float>(2 * kSub * K), c.QKdT = ws.take<float>(K * 2 * kSub);
  c.ekr = ws.take<float>(C * K), c.kr = ws.take<float>(C * K), c.PAT = ws.take<float>(C * 2 * kSub), c.pair = ws.take<float>(K);
  c.Ttmp = ws.take<float>(2 * kSub * C);
  return c;
}

void load_chunk(const KdaInputs& in, const Dims& d, int64_t h, int64_t row0, Chunk& c) {
  const int64_t K = d.K;
  c.q = in.q + row0 * d.st.qk + h * K;
  c.k = in.k + row0 * d.st.qk + h * K;
  c.v = in.v + row0 * d.st.v + d.v_offset(h);
  for (int64_t i = 0; i < c.L; ++i) {
    const int64_t row = row0 + i;
    c.beta[i] = in.beta[row * d.st.beta + h];
    const float* g = in.g + row * d.st.qk + h * K;
    double* G = c.G + i * K;
    if (i == 0) {
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) G[j] = double(g[j]);
    } else {
      const double* prev = G - K;
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) G[j] = prev[j] + double(g[j]);
    }
  }
}

// Asks for the next chunk's input rows while this one computes: a head's rows are H·K floats
// apart in the token-major inputs, a stride the hardware prefetchers do not follow far enough.
void prefetch_chunk(const KdaInputs& in, const Dims& d, int64_t h, int64_t row0, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t row = row0 + i;
    const char* qk[3] = {reinterpret_cast<const char*>(in.q + row * d.st.qk + h * d.K),
                         reinterpret_cast<const char*>(in.k + row * d.st.qk + h * d.K),
                         reinterpret_cast<const char*>(in.g + row * d.st.qk + h * d.K)};
    for (const char* p : qk)
      for (int64_t byte = 0; byte < d.K * 4; byte += 64) __builtin_prefetch(p + byte);
    const char* v = reinterpret_cast<const char*>(in.v + row * d.st.v + d.v_offset(h));
    for (int64_t byte = 0; byte < d.V * 4; byte += 64) __builtin_prefetch(v + byte);  // this task's columns
  }
}

inline const float* q_row(const Chunk& c, int64_t i) { return c.q + i * c.ldqk; }
inline const float* k_row(const Chunk& c, int64_t i) { return c.k + i * c.ldqk; }
inline const float* v_row(const Chunk& c, int64_t i) { return c.v + i * c.ldv; }

// Row block [r0, r0 + rows)'s factors, with ref = Γ_{r0}: ed_i = e^{Γ_i - ref}, [qd ; kd] =
// [q ⊙ ed ; k ⊙ ed] (and its transpose), and for the columns j < cols ekr_j = e^{ref - Γ_j},
// kr_j = k_j ⊙ ekr_j. Blocks are visited in order: the columns the previous block already had
// (j < prev_cols) are rescaled by e^{ref - ref_prev} <= 1 instead of exponentiated again.
// Returns the largest exponent among the new columns (Γ falls along j: the last column's).
float block_factors(Chunk& c, const Dims& d, int64_t r0, int64_t rows, int64_t prev_r0, int64_t prev_cols,
                    int64_t cols) {
  const int64_t K = d.K;
  const double* ref = c.G + r0 * K;
  float* qd = c.QKd;
  float* kd = c.QKd + rows * K;
  for (int64_t i = 0; i < rows; ++i) {
    const double* G = c.G + (r0 + i) * K;
    float* e = c.ed + i * K;
#pragma omp simd
    for (int64_t j = 0; j < K; ++j) e[j] = float(G[j] - ref[j]);
  }
  exp_inplace(c.ed, rows * K);
  // e^{Γ_i} = e^{ref} e^{Γ_i - ref} for the chunk-level factors (wy_form).
  float* e_ref = c.pair;
  for (int64_t j = 0; j < K; ++j) e_ref[j] = float(ref[j]);
  exp_inplace(e_ref, K);
  for (int64_t i = 0; i < rows; ++i) {
    const float *e = c.ed + i * K, *q = q_row(c, r0 + i), *k = k_row(c, r0 + i);
    float* eg = c.eG + (r0 + i) * K;
#pragma omp simd
    for (int64_t j = 0; j < K; ++j) {
      qd[i * K + j] = q[j] * e[j];
      kd[i * K + j] = k[j] * e[j];
      eg[j] = e_ref[j] * e[j];
    }
  }
  transpose(c.QKd, 2 * rows, K, K, c.QKdT, 2 * rows);
  if (prev_cols > 0) {
    const double* prev_ref = c.G + prev_r0 * K;
    for (int64_t ch = 0; ch < K; ++ch) c.pair[ch] = float(ref[ch] - prev_ref[ch]);
    exp_inplace(c.pair, K);
    for (int64_t j = 0; j < prev_cols; ++j) {
      float *e = c.ekr + j * K, *kr = c.kr + j * K;
#pragma omp simd
      for (int64_t ch = 0; ch < K; ++ch) {
        e[ch] *= c.pair[ch];
        kr[ch] *= c.pair[ch];
      }
    }
  }
  for (int64_t j = prev_cols; j < cols; ++j) {
    const double* G = c.G + j * K;
    float* e = c.ekr + j * K;
#pragma omp simd
    for (int64_t ch = 0; ch < K; ++ch) e[ch] = float(ref[ch] - G[ch]);
  }
  float max_exponent = 0.0f;
  if (cols > prev_cols) {
    const float* last = c.ekr + (cols - 1) * K;
    for (int64_t ch = 0; ch < K; ++ch) max_exponent = std::max(max_exponent, last[ch]);
  }
  exp_inplace(c.ekr + prev_cols * K, (cols - prev_cols) * K);
  for (int64_t j = prev_cols; j < cols; ++j) {
    const float *e = c.ekr + j * K, *k = k_row(c, j);
    float* kr = c.kr + j * K;
#pragma omp simd
    for (int64_t ch = 0; ch < K; ++ch) kr[ch] = k[ch] * e[ch];
  }
  return max_exponent;
}

// Columns of row block [r0, ...) computed as one product: all up to the block's end (dense),
// or only the earlier blocks' (pairwise: the diagonal sub-block goes pair by pair).
inline int64_t block_columns(bool pairwise, int64_t r0, int64_t r1) { return pairwise ? r0 : r1; }

// e^{Γ_i - Γ_j} over the key channels, for i >= j (exponents <= 0).
const float* pair_decay(Chunk& c, int64_t K, int64_t i, int64_t j) {
  const double *gi = c.G + i * K, *gj = c.G + j * K;
#pragma omp simd
  for (int64_t ch = 0; ch < K; ++ch) c.pair[ch] = float(gi[ch] - gj[ch]);
  exp_inplace(c.pair, K);
  return c.pair;
}

// T = (I + diag(β) Ã)^{-1}, lower triangular, by blocks of 16: each diagonal block by forward
// substitution (T_i = e_i - Σ_{m<i} β_i Ã_im T_m), each block row's left part as
// T[a, :r0] = -T_aa · (A[a, :r0] · T[:r0, :r0]).
void invert_unit_lower(Chunk& c, const Dims& d, const Mm& mm, float* scratch) {
  const int64_t C = d.C, L = c.L;
  std::fill(c.T, c.T + C * L, 0.0f);
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t rows = std::min(kSub, L - r0);
    for (int64_t i = r0; i < r0 + rows; ++i) {
      float* ti = c.T + i * C;
      ti[i] = 1.0f;
      for (int64_t m = r0; m < i; ++m) {
        const float a = c.beta[i] * c.A[i * C + m];
        const float* tm = c.T + m * C;
#pragma omp simd
        for (int64_t j = r0; j <= m; ++j) ti[j] -= a * tm[j];
      }
    }
    if (r0 == 0) continue;
    // scratch = diag(β) Ã[a, :r0] · T[:r0, :r0]; then T[a, :r0] = -T_aa · scratch.
    for (int64_t i = 0; i < rows; ++i) {
      const float b = c.beta[r0 + i];
      float* out = scratch + i * C;
      const float* a = c.A + (r0 + i) * C;
#pragma omp simd
      for (int64_t j = 0; j < r0; ++j) out[j] = b * a[j];
    }
    float* Y = scratch + kSub * C;
    mm(false, rows, r0, r0, 1.0f, scratch, C, c.T, C, 0.0f, Y, C);
    mm(false, rows, r0, rows, -1.0f, c.T + r0 * C + r0, C, Y, C, 0.0f, c.T + r0 * C, C);
  }
}

// P, Ã and T of a loaded chunk. Returns the largest dense exponent used.
float intra_chunk(Chunk& c, const Dims& d, bool pairwise, const Mm& mm) {
  const int64_t K = d.K, C = d.C, L = c.L;
  float max_exponent = 0.0f;
  int64_t prev_r0 = 0, prev_cols = 0;
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t rows = std::min(kSub, L - r0), r1 = r0 + rows;
    const int64_t cols = block_columns(pairwise, r0, r1);
    max_exponent = std::max(max_exponent, block_factors(c, d, r0, rows, prev_r0, prev_cols, cols));
    prev_r0 = r0, prev_cols = cols;
    // [P ; Ã]ᵀ of the block = kr · [qd ; kd]ᵀ, transposed into the block's rows of P and Ã.
    mm(false, cols, 2 * rows, K, 1.0f, c.kr, K, c.QKdT, 2 * rows, 0.0f, c.PAT, 2 * rows);
    transpose(c.PAT, cols, rows, 2 * rows, c.P + r0 * C, C);
    transpose(c.PAT + rows, cols, rows, 2 * rows, c.A + r0 * C, C);
    for (int64_t i = r0; i < r1; ++i) {  // causal masks: P keeps j <= i, Ã keeps j < i
      std::fill(c.P + i * C + std::min(cols, i + 1), c.P + i * C + L, 0.0f);
      std::fill(c.A + i * C + std::min(cols, i), c.A + i * C + L, 0.0f);
    }
    if (!pairwise) continue;
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = r0; j <= i; ++j) {
        const float *e = pair_decay(c, K, i, j), *kj = k_row(c, j);
        c.P[i * C + j] = dot3(q_row(c, i), kj, e, K);
        if (j < i) c.A[i * C + j] = dot3(k_row(c, i), kj, e, K);
      }
  }
  invert_unit_lower(c, d, mm, c.Ttmp);
  return max_exponent;
}

// Q̂, W, E, Kt and the decay factors; E = U - W S0 needs the chunk's start state (row stride
// ld_s0). e^Γ comes from intra_chunk's row blocks.
void wy_form(Chunk& c, const Dims& d, const float* S0, int64_t ld_s0, const Mm& mm) {
  const int64_t K = d.K, V = d.V, C = d.C, L = c.L;
  const double* GL = c.G + (L - 1) * K;
  for (int64_t i = 0; i < L; ++i) {
    const double* G = c.G + i * K;
    float* e = c.eKt + i * K;
#pragma omp simd
    for (int64_t j = 0; j < K; ++j) e[j] = float(GL[j] - G[j]);
  }
  exp_inplace(c.eKt, L * K);
  for (int64_t j = 0; j < K; ++j) c.eGL[j] = float(GL[j]);
  exp_inplace(c.eGL, K);
  float* Qh = c.QW;
  float* W = c.QW + L * K;
  for (int64_t i = 0; i < L; ++i) {
    const float *q = q_row(c, i), *k = k_row(c, i), *v = v_row(c, i), *eg = c.eG + i * K, *ekt = c.eKt + i * K;
    const float b = c.beta[i];
#pragma omp simd
    for (int64_t j = 0; j < K; ++j) {
      Qh[i * K + j] = q[j] * eg[j];
      c.Xk[i * K + j] = b * k[j] * eg[j];
      c.Kt[i * K + j] = k[j] * ekt[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) c.Xv[i * V + j] = b * v[j];
  }
  // W = T Xk, U = T Xv, block row by block row (T is lower triangular).
  for (int64_t r0 = 0; r0 < L; r0 += kSub) {
    const int64_t rows = std::min(kSub, L - r0);
    mm(false, rows, K, r0 + rows, 1.0f, c.T + r0 * C, C, c.Xk, K, 0.0f, W + r0 * K, K);
    mm(false, rows, V, r0 + rows, 1.0f, c.T + r0 * C, C, c.Xv, V, 0.0f, c.E + r0 * V, V);
  }
  mm(false, L, V, K, -1.0f, W, K, S0, ld_s0, 1.0f, c.E, V);
}

// S ← diag(e^{Γ_L}) S + Ktᵀ E.
void advance_state(const Chunk& c, const Dims& d, float* S, const Mm& mm) {
  for (int64_t ch = 0; ch < d.K; ++ch) {
    const float e = c.eGL[ch];
    float* row = S + ch * d.V;
#pragma omp simd
    for (int64_t j = 0; j < d.V; ++j) row[j] *= e;
  }
  mm(true, d.K, d.V, c.L, 1.0f, c.Kt, d.K, c.E, d.V, 1.0f, S, d.V);
}

void* mm_scratch(Arena& ws, const Dims& d, bool bf16) {
  if (!bf16) return nullptr;
  const int64_t n = std::max({d.K, d.V, d.C}), big = std::max(2 * d.C, n);
  return ws.take<float>((small_gemm_bf16_scratch(big, n, big) + 3) / 4);
}

}  // namespace

float kda_chunked_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                              const KdaTask& task, float* o, float* const* final_states, KdaSavedStates* saved,
                              Arena& ws) {
  const Dims d = make_dims(shape, options, task);
  const int64_t K = d.K, V = d.V, b = task.b, h = task.h;
  const bool pairwise = options.path == KdaPath::ChunkedPairwise;
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  float* S = ws.take<float>(K * V);
  Chunk c = take_chunk(ws, d);
  const Mm mm{options.bf16_matmul, mm_scratch(ws, d, options.bf16_matmul)};
  float max_exponent = 0.0f;
  if (in.initial_states) copy_rows(in.initial_states[b] + d.state_offset(h), d.v_full, S, V, K, V);
  else std::fill(S, S + K * V, 0.0f);

  for (int64_t t0 = 0; t0 < len; t0 += d.C) {
    c.L = std::min(d.C, len - t0);
    if (saved) copy_rows(S, V, saved_state(*saved, shape, b, t0 / d.C, h) + d.v0, d.v_full, K, V);
    load_chunk(in, d, h, first + t0, c);
    prefetch_chunk(in, d, h, first + t0 + c.L, std::min(d.C, len - t0 - c.L));
    const float exponent = intra_chunk(c, d, pairwise, mm);
    if (!pairwise) max_exponent = std::max(max_exponent, exponent);
    wy_form(c, d, S, V, mm);
    // O = Q̂ S0 + P E, written straight into the output rows.
    float* O = o + (first + t0) * d.st.v + d.v_offset(h);
    mm(false, c.L, V, K, 1.0f, c.QW, K, S, V, 0.0f, O, d.st.v);
    for (int64_t r0 = 0; r0 < c.L; r0 += kSub) {
      const int64_t rows = std::min(kSub, c.L - r0);
      mm(false, rows, V, r0 + rows, 1.0f, c.P + r0 * d.C, d.C, c.E, V, 1.0f, O + r0 * d.st.v, d.st.v);
    }
    advance_state(c, d, S, mm);
  }
  if (final_states) copy_rows(S, V, final_states[b] + d.state_offset(h), d.v_full, K, V);
  return max_exponent;
}

void kda_chunked_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                               const KdaTask& task, const float* d_o, const float* const* d_final_states,
                               const KdaSavedStates& saved, const KdaGrads& grads, Arena& ws) {
  const Dims d = make_dims(shape, options, task);
  const int64_t K = d.K, V = d.V, C = d.C, b = task.b, h = task.h, ld_s0 = d.v_full;
  const bool pairwise = options.path == KdaPath::ChunkedPairwise;
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  Chunk c = take_chunk(ws, d);
  const Mm mm{options.bf16_matmul, mm_scratch(ws, d, options.bf16_matmul)};
  float* dS = ws.take<float>(K * V);       // dL/d(state at the chunk's end), then at its start
  float* dS0 = ws.take<float>(K * V);
  float* S0T = ws.take<float>(V * K);
  float* dST = ws.take<float>(V * K);
  float* DOE = ws.take<float>(2 * C * V);  // rows [0, L): dO; rows [L, 2L): -dE
  float* dE = ws.take<float>(C * V);
  float* ET = ws.take<float>(V * C);
  float* dP = ws.take<float>(C * C);
  float* dA = ws.take<float>(C * C);
  float* dT = ws.take<float>(C * C);
  float* TT = ws.take<float>(C * C);
  float* M1 = ws.take<float>(C * C);
  float* dQW = ws.take<float>(2 * C * K);  // rows [0, L): dQ̂; rows [L, 2L): dW
  float* dKt = ws.take<float>(C * K);
  float* dXk = ws.take<float>(C * K);
  float* dXv = ws.take<float>(C * V);
  float* XkT = ws.take<float>(K * C);
  float* XvT = ws.take<float>(V * C);
  float* dq = ws.take<float>(C * K);
  float* dk = ws.take<float>(C * K);
  float* dG = ws.take<float>(C * K);
  float* dbeta = ws.take<float>(C);
  float* dGL = ws.take<float>(K);
  float* dref = ws.take<float>(K);
  float* dPA = ws.take<float>(2 * kSub * C);  // [dP ; dÃ] of a row block, [2·16×C]
  float* dQKd = ws.take<float>(2 * kSub * K);
  float* dkr = ws.take<float>(C * K);

  if (d_final_states) copy_rows(d_final_states[b] + d.state_offset(h), d.v_full, dS, V, K, V);
  else std::fill(dS, dS + K * V, 0.0f);

  for (int64_t t0 = len <= 0 ? -1 : (len - 1) / C * C; t0 >= 0; t0 -= C) {
    c.L = std::min(C, len - t0);
    const int64_t L = c.L, row0 = first + t0;
    const float* S0 = saved_state(saved, shape, b, t0 / C, h) + d.v0;
    load_chunk(in, d, h, row0, c);
    prefetch_chunk(in, d, h, std::max(first, row0 - C), std::min(C, t0));
    intra_chunk(c, d, pairwise, mm);
    wy_form(c, d, S0, ld_s0, mm);
    copy_rows(d_o + row0 * d.st.v + d.v_offset(h), d.st.v, DOE, V, L, V);
    const float* dO = DOE;

    // S_L = diag(e^{Γ_L}) S0 + Ktᵀ E.
    mm(false, L, V, K, 1.0f, c.Kt, K, dS, V, 0.0f, dE, V);
    transpose(dS, K, V, V, dST, K);
    mm(false, L, K, V, 1.0f, c.E, V, dST, K, 0.0f, dKt, K);
    for (int64_t ch = 0; ch < K; ++ch) {
      const float e = c.eGL[ch];
      const float* ds = dS + ch * V;
      float* ds0 = dS0 + ch * V;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) ds0[j] = e * ds[j];
      dGL[ch] = e * dot(S0 + ch * ld_s0, ds, V);
    }
    // O = Q̂ S0 + P E.
    transpose(c.E, L, V, V, ET, C);
    mm(false, L, L, V, 1.0f, dO, V, ET, C, 0.0f, dP, C);
    for (int64_t i = 0; i < L; ++i) std::fill(dP + i * C + i + 1, dP + i * C + L, 0.0f);
    mm(true, L, V, L, 1.0f, c.P, C, dO, V, 1.0f, dE, V);
    // E = U - W S0: [dQ̂ ; dW] = [dO ; -dE] S0ᵀ and dS0 += [Q̂ ; W]ᵀ [dO ; -dE].
    for (int64_t x = 0; x < L * V; ++x) DOE[L * V + x] = -dE[x];
    transpose(S0, K, V, ld_s0, S0T, K);
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

    for (int64_t i = 0; i < L; ++i) {
      // Xk = β K e^Γ, Xv = β V; Q̂ = Q e^Γ; Kt = K e^{Γ_L - Γ}.
      const float bi = c.beta[i];
      const float *k = k_row(c, i), *v = v_row(c, i), *eg = c.eG + i * K, *ekt = c.eKt + i * K;
      const float *dxk = dXk + i * K, *dqh = dQh + i * K, *dkt = dKt + i * K;
      const float *xk = c.Xk + i * K, *qh = c.QW + i * K, *kt = c.Kt + i * K;
      float *dqi = dq + i * K, *dki = dk + i * K, *dgi = dG + i * K;
      float db = dot3(dxk, k, eg, K);
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) {
        dki[j] = bi * dxk[j] * eg[j] + dkt[j] * ekt[j];
        dgi[j] = dxk[j] * xk[j] + dqh[j] * qh[j] - dkt[j] * kt[j];
        dqi[j] = dqh[j] * eg[j];
      }
      const float* dxv = dXv + i * V;
      float* dv = grads.dv + (row0 + i) * d.st.v + d.v_offset(h);
      db += dot(dxv, v, V);
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) dv[j] = bi * dxv[j];
      // A = diag(β) Ã.
      float* da = dA + i * C;
      db += dot(da, c.A + i * C, i);
#pragma omp simd
      for (int64_t j = 0; j < i; ++j) da[j] *= bi;
      std::fill(da + i, da + L, 0.0f);
      dbeta[i] = db;
    }
    for (int64_t i = 0; i < L; ++i) {
      const float *dkt = dKt + i * K, *kt = c.Kt + i * K;
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) dGL[j] += dkt[j] * kt[j];
    }

    // Back through the row-block products [P ; Ã] = [qd ; kd] · krᵀ.
    int64_t prev_r0 = 0, prev_cols = 0;
    for (int64_t r0 = 0; r0 < L; r0 += kSub) {
      const int64_t rows = std::min(kSub, L - r0), r1 = r0 + rows;
      const int64_t cols = block_columns(pairwise, r0, r1);
      block_factors(c, d, r0, rows, prev_r0, prev_cols, cols);
      prev_r0 = r0, prev_cols = cols;
      if (cols > 0) {
        for (int64_t i = 0; i < rows; ++i) {
          std::memcpy(dPA + i * C, dP + (r0 + i) * C, size_t(cols) * 4);
          std::memcpy(dPA + (rows + i) * C, dA + (r0 + i) * C, size_t(cols) * 4);
        }
        mm(false, 2 * rows, K, cols, 1.0f, dPA, C, c.kr, K, 0.0f, dQKd, K);
        mm(true, cols, K, 2 * rows, 1.0f, dPA, C, c.QKd, K, 0.0f, dkr, K);
        std::fill(dref, dref + K, 0.0f);
        for (int64_t i = 0; i < rows; ++i) {
          const float *qd = c.QKd + i * K, *kd = c.QKd + (rows + i) * K;
          const float *dqd = dQKd + i * K, *dkd = dQKd + (rows + i) * K, *e = c.ed + i * K;
          float *dqi = dq + (r0 + i) * K, *dki = dk + (r0 + i) * K, *dgi = dG + (r0 + i) * K;
#pragma omp simd
          for (int64_t j = 0; j < K; ++j) {
            dqi[j] += dqd[j] * e[j];
            dki[j] += dkd[j] * e[j];
            const float s = dqd[j] * qd[j] + dkd[j] * kd[j];
            dgi[j] += s;
            dref[j] -= s;
          }
        }
        for (int64_t j = 0; j < cols; ++j) {
          const float *dkrj = dkr + j * K, *krj = c.kr + j * K, *e = c.ekr + j * K;
          float *dkj = dk + j * K, *dgj = dG + j * K;
#pragma omp simd
          for (int64_t ch = 0; ch < K; ++ch) {
            const float s = dkrj[ch] * krj[ch];
            dkj[ch] += dkrj[ch] * e[ch];
            dgj[ch] -= s;
            dref[ch] += s;
          }
        }
        float* dg0 = dG + r0 * K;
#pragma omp simd
        for (int64_t j = 0; j < K; ++j) dg0[j] += dref[j];
      }
      if (!pairwise) continue;
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = r0; j <= i; ++j) {
          const float dp = dP[i * C + j], da = j < i ? dA[i * C + j] : 0.0f;
          const float *e = pair_decay(c, K, i, j), *qi = q_row(c, i), *ki = k_row(c, i), *kj = k_row(c, j);
          float *dqi = dq + i * K, *dki = dk + i * K, *dkj = dk + j * K, *dgi = dG + i * K, *dgj = dG + j * K;
#pragma omp simd
          for (int64_t ch = 0; ch < K; ++ch) {
            const float left = (dp * qi[ch] + da * ki[ch]) * e[ch];
            dqi[ch] += dp * kj[ch] * e[ch];
            dki[ch] += da * kj[ch] * e[ch];
            dkj[ch] += left;
            dgi[ch] += left * kj[ch];
            dgj[ch] -= left * kj[ch];
          }
        }
    }
    float* dg_last = dG + (L - 1) * K;
#pragma omp simd
    for (int64_t j = 0; j < K; ++j) dg_last[j] += dGL[j];
    // Γ = cumsum(g): dg_j = Σ_{i >= j} dΓ_i.
    for (int64_t i = L - 2; i >= 0; --i) {
      float *cur = dG + i * K, *next = dG + (i + 1) * K;
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) cur[j] += next[j];
    }
    for (int64_t i = 0; i < L; ++i) {
      const int64_t row = row0 + i;
      std::memcpy(grads.dq + row * d.st.qk + h * K, dq + i * K, size_t(K) * 4);
      std::memcpy(grads.dk + row * d.st.qk + h * K, dk + i * K, size_t(K) * 4);
      std::memcpy(grads.dg + row * d.st.qk + h * K, dG + i * K, size_t(K) * 4);
      grads.dbeta[row * d.st.beta + h] = dbeta[i];
    }
    std::swap(dS, dS0);
  }
  if (grads.d_initial_states) copy_rows(dS, V, grads.d_initial_states[b] + d.state_offset(h), d.v_full, K, V);
}

}  // namespace hyla
