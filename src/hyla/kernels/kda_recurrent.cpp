// The recurrent path: the delta rule token by token. The state's V columns evolve independently,
// so a (sequence, head) is processed in column blocks of up to 64: a K×64 block (32 KB at K=128)
// stays in L1 across tokens. Each token costs one pass over the block: the pass applies the
// previous token's pending rank-1 update, decays the rows, and accumulates S̃ᵀk and S̃ᵀq.
#include <algorithm>
#include <cstring>

#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/kernels/kda_internal.h"
#include "hyla/kernels/vmath.h"

namespace hyla {
namespace {

constexpr int64_t kBlock = 64;     // state columns per block
constexpr int64_t kSegment = 16;   // tokens whose states the backward keeps at once

#if defined(__AVX512F__)
template <int VECS>
void state_pass_vec(float* S, int64_t K, int64_t ld, const float* pending_k, const float* pending_u,
                    const float* decay, const float* k, const float* q, float* kS, float* qS, __mmask16 last) {
  auto mask = [&](int v) { return v + 1 < VECS ? __mmask16(0xffff) : last; };
  __m512 u[VECS], ks[VECS], qs[VECS];
  for (int v = 0; v < VECS; ++v) {
    u[v] = pending_k ? _mm512_maskz_loadu_ps(mask(v), pending_u + 16 * v) : _mm512_setzero_ps();
    ks[v] = qs[v] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < K; ++c) {
    float* row = S + c * ld;
    const __m512 pk = _mm512_set1_ps(pending_k ? pending_k[c] : 0.0f), d = _mm512_set1_ps(decay[c]);
    const __m512 kc = _mm512_set1_ps(k[c]), qc = _mm512_set1_ps(q[c]);
    for (int v = 0; v < VECS; ++v) {
      __m512 r = _mm512_maskz_loadu_ps(mask(v), row + 16 * v);
      r = _mm512_mul_ps(_mm512_fmadd_ps(pk, u[v], r), d);
      _mm512_mask_storeu_ps(row + 16 * v, mask(v), r);
      ks[v] = _mm512_fmadd_ps(kc, r, ks[v]);
      qs[v] = _mm512_fmadd_ps(qc, r, qs[v]);
    }
  }
  for (int v = 0; v < VECS; ++v) {
    _mm512_mask_storeu_ps(kS + 16 * v, mask(v), ks[v]);
    _mm512_mask_storeu_ps(qS + 16 * v, mask(v), qs[v]);
  }
}
#endif

// One pass over a K×w state block (w <= 64, row stride ld): row_c ← (row_c + pk[c]·u) · decay[c]
// (the pending update of the previous token, when pending_k is set), then kS = Σ_c k[c]·row_c
// and qS = Σ_c q[c]·row_c. `q` may be null (then qS is not written).
void state_pass(float* S, int64_t K, int64_t w, int64_t ld, const float* pending_k, const float* pending_u,
                const float* decay, const float* k, const float* q, float* kS, float* qS) {
#if defined(__AVX512F__)
  if (!q) q = k, qS = kS + kBlock;  // reuse the kS path; the caller passes room for 2 blocks
  const __mmask16 last = __mmask16(w % 16 == 0 ? 0xffff : (1u << (w % 16)) - 1);
  switch ((w + 15) / 16) {
    case 1: return state_pass_vec<1>(S, K, ld, pending_k, pending_u, decay, k, q, kS, qS, last);
    case 2: return state_pass_vec<2>(S, K, ld, pending_k, pending_u, decay, k, q, kS, qS, last);
    case 3: return state_pass_vec<3>(S, K, ld, pending_k, pending_u, decay, k, q, kS, qS, last);
    default: return state_pass_vec<4>(S, K, ld, pending_k, pending_u, decay, k, q, kS, qS, last);
  }
#else
  std::fill(kS, kS + w, 0.0f);
  if (q) std::fill(qS, qS + w, 0.0f);
  for (int64_t c = 0; c < K; ++c) {
    float* row = S + c * ld;
    for (int64_t j = 0; j < w; ++j) {
      float r = row[j];
      if (pending_k) r += pending_k[c] * pending_u[j];
      r *= decay[c];
      row[j] = r;
      kS[j] += k[c] * r;
      if (q) qS[j] += q[c] * r;
    }
  }
#endif
}

void rank1_update(float* S, int64_t K, int64_t w, int64_t ld, const float* k, const float* u) {
  for (int64_t c = 0; c < K; ++c) {
    float* row = S + c * ld;
    for (int64_t j = 0; j < w; ++j) row[j] += k[c] * u[j];
  }
}

void copy_block(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows, int64_t w) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, size_t(w) * sizeof(float));
}

}  // namespace

void kda_recurrent_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                                int64_t h, float* o, float* final_state, KdaSavedStates* saved,
                                KdaWorkspace::Thread& ws) {
  const int64_t K = shape.key_dim, V = shape.value_dim, C = options.chunk_size;
  const KdaStrides st = strides(shape);
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  float* S = ws.take(K * kBlock);
  float* decay = ws.take(K);
  float* kS = ws.take(2 * kBlock);
  float* qS = ws.take(kBlock);
  float* u = ws.take(kBlock);
  const float* initial = in.initial_state ? in.initial_state + (b * shape.heads + h) * K * V : nullptr;
  for (int64_t v0 = 0; v0 < V; v0 += kBlock) {
    const int64_t w = std::min(kBlock, V - v0);
    if (initial) copy_block(initial + v0, V, S, kBlock, K, w);
    else std::fill(S, S + K * kBlock, 0.0f);
    const float* pending_k = nullptr;
    for (int64_t t = 0; t < len; ++t) {
      const int64_t row = first + t;
      const float* qt = in.q + row * st.qk + h * K;
      const float* kt = in.k + row * st.qk + h * K;
      const float* vt = in.v + row * st.v + h * V + v0;
      const float* gt = in.g + row * st.qk + h * K;
      const float beta = in.beta[row * st.beta + h];
      if (saved && t % C == 0) {
        if (pending_k) rank1_update(S, K, w, kBlock, pending_k, u), pending_k = nullptr;
        copy_block(S, kBlock, saved_state(*saved, shape, b, t / C, h) + v0, V, K, w);
      }
      std::memcpy(decay, gt, size_t(K) * sizeof(float));
      exp_inplace(decay, K);
      state_pass(S, K, w, kBlock, pending_k, u, decay, kt, qt, kS, qS);
      // e = v - S̃ᵀk; the update β k eᵀ is applied by the next pass; o = S̃ᵀq + β (q·k) e.
      const float qk = dot(qt, kt, K);
      float* ot = o + row * st.v + h * V + v0;
      for (int64_t j = 0; j < w; ++j) {
        u[j] = beta * (vt[j] - kS[j]);
        ot[j] = qS[j] + qk * u[j];
      }
      pending_k = kt;
    }
    if (pending_k) rank1_update(S, K, w, kBlock, pending_k, u);
    if (final_state) copy_block(S, kBlock, final_state + (b * shape.heads + h) * K * V + v0, V, K, w);
  }
  ws.release();
}

// Backward by reverse-mode through the recurrence. States are recomputed from the chunk-start
// states the forward saved, kSegment tokens at a time (their S_{t-1} kept in a small ring).
void kda_recurrent_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                                 int64_t h, const float* d_o, const float* d_final_state,
                                 const KdaSavedStates& saved, const KdaGrads& grads, KdaWorkspace::Thread& ws) {
  const int64_t K = shape.key_dim, V = shape.value_dim, C = options.chunk_size;
  const KdaStrides st = strides(shape);
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  float* S = ws.take(K * kBlock);
  float* prev = ws.take(kSegment * K * kBlock);  // S_{t-1} for each token of the segment
  float* us = ws.take(kSegment * kBlock);        // u_t = β_t e_t
  float* es = ws.take(kSegment * kBlock);        // e_t = v_t - S̃_tᵀ k_t
  float* dS = ws.take(K * kBlock);
  float* decay = ws.take(K);
  float* kS = ws.take(2 * kBlock);
  float* du = ws.take(kBlock);
  float* de = ws.take(kBlock);

  for (int64_t t = 0; t < len; ++t) {  // the V blocks accumulate into these
    const int64_t row = first + t;
    std::fill(grads.dq + row * st.qk + h * K, grads.dq + row * st.qk + h * K + K, 0.0f);
    std::fill(grads.dk + row * st.qk + h * K, grads.dk + row * st.qk + h * K + K, 0.0f);
    std::fill(grads.dg + row * st.qk + h * K, grads.dg + row * st.qk + h * K + K, 0.0f);
    grads.dbeta[row * st.beta + h] = 0.0f;
  }
  for (int64_t v0 = 0; v0 < V; v0 += kBlock) {
    const int64_t w = std::min(kBlock, V - v0);
    if (d_final_state) copy_block(d_final_state + (b * shape.heads + h) * K * V + v0, V, dS, kBlock, K, w);
    else std::fill(dS, dS + K * kBlock, 0.0f);
    for (int64_t c0 = (len - 1) / C * C; c0 >= 0 && len > 0; c0 -= C) {
      const int64_t c1 = std::min(len, c0 + C);
      for (int64_t s0 = (c1 - 1 - c0) / kSegment * kSegment + c0; s0 >= c0; s0 -= kSegment) {
        const int64_t s1 = std::min(c1, s0 + kSegment);
        // Recompute from the chunk start up to s1, keeping S_{t-1}, u_t and e_t for t in [s0, s1).
        copy_block(saved_state(saved, shape, b, c0 / C, h) + v0, V, S, kBlock, K, w);
        const float* pending_k = nullptr;
        float* pending_u = us;
        for (int64_t t = c0; t < s1; ++t) {
          const int64_t row = first + t;
          const float* kt = in.k + row * st.qk + h * K;
          if (t >= s0) {
            if (pending_k) rank1_update(S, K, w, kBlock, pending_k, pending_u), pending_k = nullptr;
            copy_block(S, kBlock, prev + (t - s0) * K * kBlock, kBlock, K, w);
          }
          std::memcpy(decay, in.g + row * st.qk + h * K, size_t(K) * sizeof(float));
          exp_inplace(decay, K);
          state_pass(S, K, w, kBlock, pending_k, pending_u, decay, kt, nullptr, kS, nullptr);
          const float* vt = in.v + row * st.v + h * V + v0;
          const float beta = in.beta[row * st.beta + h];
          const int64_t slot = t >= s0 ? t - s0 : 0;
          for (int64_t j = 0; j < w; ++j) {
            es[slot * kBlock + j] = vt[j] - kS[j];
            us[slot * kBlock + j] = beta * es[slot * kBlock + j];
          }
          pending_k = kt;
          pending_u = us + slot * kBlock;
        }
        for (int64_t t = s1 - 1; t >= s0; --t) {
          const int64_t row = first + t, slot = t - s0;
          const float* qt = in.q + row * st.qk + h * K;
          const float* kt = in.k + row * st.qk + h * K;
          const float* dot_ = d_o + row * st.v + h * V + v0;
          const float beta = in.beta[row * st.beta + h];
          const float* P = prev + slot * K * kBlock;
          const float* u = us + slot * kBlock;
          const float* e = es + slot * kBlock;
          float* dq = grads.dq + row * st.qk + h * K;
          float* dk = grads.dk + row * st.qk + h * K;
          float* dg = grads.dg + row * st.qk + h * K;
          std::memcpy(decay, in.g + row * st.qk + h * K, size_t(K) * sizeof(float));
          exp_inplace(decay, K);
          // o = S_tᵀq, S_t = S̃ + k uᵀ: dS += q doᵀ; dq = S_t do; dk += dS u; du = dSᵀ k.
          std::fill(du, du + w, 0.0f);
          for (int64_t c = 0; c < K; ++c) {
            const float* pr = P + c * kBlock;
            float* ds = dS + c * kBlock;
            float dq_c = 0.0f, dk_c = 0.0f;
            for (int64_t j = 0; j < w; ++j) {
              const float s_t = decay[c] * pr[j] + kt[c] * u[j];
              ds[j] += qt[c] * dot_[j];
              dq_c += s_t * dot_[j];
              dk_c += ds[j] * u[j];
              du[j] += kt[c] * ds[j];
            }
            dq[c] += dq_c;
            dk[c] += dk_c;
          }
          // u = β e, e = v - S̃ᵀk.
          float dbeta = 0.0f;
          float* dv = grads.dv + row * st.v + h * V + v0;
          for (int64_t j = 0; j < w; ++j) {
            dbeta += du[j] * e[j];
            de[j] = beta * du[j];
            dv[j] = de[j];
          }
          grads.dbeta[row * st.beta + h] += dbeta;
          // dS̃ = dS - k deᵀ; dk -= S̃ de; dg = rowsum(S̃ ⊙ dS̃); dS_{t-1} = diag(exp g) dS̃.
          for (int64_t c = 0; c < K; ++c) {
            const float* pr = P + c * kBlock;
            float* ds = dS + c * kBlock;
            float dk_c = 0.0f, dg_c = 0.0f;
            for (int64_t j = 0; j < w; ++j) {
              const float s_tilde = decay[c] * pr[j];
              const float ds_tilde = ds[j] - kt[c] * de[j];
              dk_c += s_tilde * de[j];
              dg_c += s_tilde * ds_tilde;
              ds[j] = decay[c] * ds_tilde;
            }
            dk[c] -= dk_c;
            dg[c] += dg_c;
          }
        }
      }
    }
    if (grads.d_initial_state)
      copy_block(dS, kBlock, grads.d_initial_state + (b * shape.heads + h) * K * V + v0, V, K, w);
  }
  ws.release();
}

void kda_decode_step(const KdaShape& shape, int64_t batch, const float* q, const float* k, const float* v,
                     const float* g, const float* beta, float* states, float* o) {
  const int64_t H = shape.heads, K = shape.key_dim, V = shape.value_dim;
#pragma omp parallel
  {
    float decay[1024], kS[2 * kBlock], qS[kBlock];
    HYLA_ASSERT(K <= 1024);
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t x = b * H + h;
        const float* qt = q + x * K;
        const float* kt = k + x * K;
        std::memcpy(decay, g + x * K, size_t(K) * sizeof(float));
        exp_inplace(decay, K);
        const float qk = dot(qt, kt, K);
        for (int64_t v0 = 0; v0 < V; v0 += kBlock) {
          const int64_t w = std::min(kBlock, V - v0);
          float* S = states + x * K * V + v0;
          state_pass(S, K, w, V, nullptr, nullptr, decay, kt, qt, kS, qS);
          float u[kBlock];
          for (int64_t j = 0; j < w; ++j) {
            u[j] = beta[x] * (v[x * V + v0 + j] - kS[j]);
            o[x * V + v0 + j] = qS[j] + qk * u[j];
          }
          rank1_update(S, K, w, V, kt, u);
        }
      }
  }
}

}  // namespace hyla
