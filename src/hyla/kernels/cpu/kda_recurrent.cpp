// The recurrent path: the delta rule token by token. The state's V columns evolve independently,
// so a (sequence, head) is processed in column blocks of up to 64: a K×64 block (32 KB at K=128)
// stays in L1 across tokens. Each token costs one pass over the block: the pass applies the
// previous token's pending rank-1 update, decays the rows, and accumulates S̃ᵀk and S̃ᵀq.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "hyla/core/error.h"
#include "hyla/core/simd.h"
#include "hyla/core/team.h"
#include "hyla/kernels/cpu/kda_internal.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {
namespace {

constexpr int64_t kBlock = 64;  // state columns per block

template <int VECS, bool WITH_Q, bool KEEP_BEFORE_DECAY>
void state_pass_vec(float* S, int64_t K, int64_t ld, const float* pending_k, const float* pending_u,
                    const float* decay, const float* k, const float* q, float* kS, float* qS, float* before_decay,
                    vec::Mask last) {
  using vec::Vec;
  using vec::unroll;
  auto mask = [&](int v) { return v + 1 < VECS ? vec::kAll : last; };
  Vec u[VECS], ks[VECS], qs[VECS];
  unroll<VECS>([&](auto v) {
    u[v] = pending_k ? vec::load(pending_u + 16 * v, mask(v)) : vec::zero();
    ks[v] = qs[v] = vec::zero();
  });
  for (int64_t c = 0; c < K; ++c) {
    float* row = S + c * ld;
    const Vec pk = vec::broadcast(pending_k ? pending_k[c] : 0.0f), d = vec::broadcast(decay[c]);
    const Vec kc = vec::broadcast(k[c]), qc = vec::broadcast(WITH_Q ? q[c] : 0.0f);
    unroll<VECS>([&](auto v) {
      const Vec updated = vec::fmadd(pk, u[v], vec::load(row + 16 * v, mask(v)));
      if (KEEP_BEFORE_DECAY) vec::store(before_decay + c * ld + 16 * v, updated, mask(v));
      const Vec r = updated * d;
      vec::store(row + 16 * v, r, mask(v));
      ks[v] = vec::fmadd(kc, r, ks[v]);
      if (WITH_Q) qs[v] = vec::fmadd(qc, r, qs[v]);
    });
  }
  unroll<VECS>([&](auto v) {
    vec::store(kS + 16 * v, ks[v], mask(v));
    if (WITH_Q) vec::store(qS + 16 * v, qs[v], mask(v));
  });
}

template <typename F>
void dispatch_width(int64_t w, F&& f) {
  const vec::Mask last = vec::lane_range(0, w % 16 == 0 ? 16 : w % 16);
  switch ((w + 15) / 16) {
    case 1: return f(std::integral_constant<int, 1>{}, last);
    case 2: return f(std::integral_constant<int, 2>{}, last);
    case 3: return f(std::integral_constant<int, 3>{}, last);
    default: return f(std::integral_constant<int, 4>{}, last);
  }
}

// One pass over a K×w state block (w <= 64, row stride ld): row_c ← (row_c + pk[c]·u) · decay[c]
// (the pending update of the previous token, when pending_k is set), then kS = Σ_c k[c]·row_c
// and (when q is given) qS = Σ_c q[c]·row_c. With before_decay (used without q), the updated
// rows before the decay (the previous token's full state) are also stored there.
void state_pass(float* S, int64_t K, int64_t w, int64_t ld, const float* pending_k, const float* pending_u,
                const float* decay, const float* k, const float* q, float* kS, float* qS,
                float* before_decay = nullptr) {
  dispatch_width(w, [&](auto vecs, vec::Mask last) {
    constexpr int kVecs = decltype(vecs)::value;
    if (before_decay)
      state_pass_vec<kVecs, false, true>(S, K, ld, pending_k, pending_u, decay, k, q, kS, qS, before_decay, last);
    else if (q)
      state_pass_vec<kVecs, true, false>(S, K, ld, pending_k, pending_u, decay, k, q, kS, qS, before_decay, last);
    else
      state_pass_vec<kVecs, false, false>(S, K, ld, pending_k, pending_u, decay, k, q, kS, qS, before_decay, last);
  });
}

// Reverse-mode pass A for one token over a K×w block (w <= 64): with S_t = decay⊙S_{t-1} + k uᵀ,
// dS += q doᵀ; dq[c] += S_t[c]·do; dk[c] += dS[c]·u; du = dSᵀk.
template <int VECS>
void backward_pass_a(const float* prev, float* dS, int64_t K, int64_t ld, const float* decay, const float* k,
                     const float* q, const float* u, const float* d_o, float* dq, float* dk, float* du,
                     vec::Mask last) {
  using vec::Vec;
  using vec::unroll;
  auto mask = [&](int v) { return v + 1 < VECS ? vec::kAll : last; };
  Vec uv[VECS], dov[VECS], duv[VECS];
  unroll<VECS>([&](auto v) {
    uv[v] = vec::load(u + 16 * v, mask(v));
    dov[v] = vec::load(d_o + 16 * v, mask(v));
    duv[v] = vec::zero();
  });
  for (int64_t c = 0; c < K; ++c) {
    const Vec dc = vec::broadcast(decay[c]), kc = vec::broadcast(k[c]), qc = vec::broadcast(q[c]);
    Vec dq_acc = vec::zero(), dk_acc = vec::zero();
    unroll<VECS>([&](auto v) {
      const Vec s_t = vec::fmadd(kc, uv[v], dc * vec::load(prev + c * ld + 16 * v, mask(v)));
      const Vec ds = vec::fmadd(qc, dov[v], vec::load(dS + c * ld + 16 * v, mask(v)));
      vec::store(dS + c * ld + 16 * v, ds, mask(v));
      dq_acc = vec::fmadd(s_t, dov[v], dq_acc);
      dk_acc = vec::fmadd(ds, uv[v], dk_acc);
      duv[v] = vec::fmadd(kc, ds, duv[v]);
    });
    dq[c] += vec::sum(dq_acc);
    dk[c] += vec::sum(dk_acc);
  }
  unroll<VECS>([&](auto v) { vec::store(du + 16 * v, duv[v], mask(v)); });
}

// Pass B: with S̃ = decay⊙S_{t-1} and dS̃ = dS - k deᵀ: dk[c] -= S̃[c]·de; dg[c] += S̃[c]·dS̃[c];
// dS ← decay⊙dS̃ (the gradient for S_{t-1}).
template <int VECS>
void backward_pass_b(const float* prev, float* dS, int64_t K, int64_t ld, const float* decay, const float* k,
                     const float* de, float* dk, float* dg, vec::Mask last) {
  using vec::Vec;
  using vec::unroll;
  auto mask = [&](int v) { return v + 1 < VECS ? vec::kAll : last; };
  Vec dev[VECS];
  unroll<VECS>([&](auto v) { dev[v] = vec::load(de + 16 * v, mask(v)); });
  for (int64_t c = 0; c < K; ++c) {
    const Vec dc = vec::broadcast(decay[c]), kc = vec::broadcast(k[c]);
    Vec dk_acc = vec::zero(), dg_acc = vec::zero();
    unroll<VECS>([&](auto v) {
      const Vec s_tilde = dc * vec::load(prev + c * ld + 16 * v, mask(v));
      const Vec ds_tilde = vec::load(dS + c * ld + 16 * v, mask(v)) - kc * dev[v];
      dk_acc = vec::fmadd(s_tilde, dev[v], dk_acc);
      dg_acc = vec::fmadd(s_tilde, ds_tilde, dg_acc);
      vec::store(dS + c * ld + 16 * v, dc * ds_tilde, mask(v));
    });
    dk[c] -= vec::sum(dk_acc);
    dg[c] += vec::sum(dg_acc);
  }
}

void rank1_update(float* S, int64_t K, int64_t w, int64_t ld, const float* k, const float* u) {
  for (int64_t c = 0; c < K; ++c) {
    float* row = S + c * ld;
    for (int64_t j = 0; j < w; ++j) row[j] += k[c] * u[j];
  }
}

}  // namespace

void kda_recurrent_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                                const KdaTask& task, float* o, float* const* final_states, KdaSavedStates* saved,
                                Arena& ws) {
  const int64_t b = task.b, h = task.h;
  const int64_t K = shape.key_dim, V = shape.value_dim, C = options.chunk_size;
  const KdaStrides st = strides(shape);
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  float* S = ws.take<float>(K * kBlock);
  float* decay = ws.take<float>(K);
  float* kS = ws.take<float>(kBlock);
  float* qS = ws.take<float>(kBlock);
  float* u = ws.take<float>(kBlock);
  const float* initial = in.initial_states ? in.initial_states[b] + h * K * V : nullptr;
  for (int64_t v0 = task.v0; v0 < task.v0 + task.width; v0 += kBlock) {
    const int64_t w = std::min(kBlock, task.v0 + task.width - v0);
    if (initial) copy_rows(initial + v0, V, S, kBlock, K, w);
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
        copy_rows(S, kBlock, saved_state(*saved, shape, b, t / C, h) + v0, V, K, w);
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
    if (final_states) copy_rows(S, kBlock, final_states[b] + h * K * V + v0, V, K, w);
  }
}

// Backward by reverse-mode through the recurrence. Each chunk's states are recomputed once from
// the chunk-start state the forward saved, keeping S_{t-1}, u_t and e_t of every token of the chunk.
void kda_recurrent_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                                 const KdaTask& task, const float* d_o, const float* const* d_final_states,
                                 const KdaSavedStates& saved, const KdaGrads& grads, Arena& ws) {
  const int64_t b = task.b, h = task.h;
  const int64_t K = shape.key_dim, V = shape.value_dim, C = options.chunk_size;
  const KdaStrides st = strides(shape);
  const int64_t first = in.starts[b], len = in.starts[b + 1] - first;
  float* S = ws.take<float>(K * kBlock);
  float* prev = ws.take<float>(C * K * kBlock);  // S_{t-1} for each token of the chunk
  float* us = ws.take<float>(C * kBlock);        // u_t = β_t e_t
  float* es = ws.take<float>(C * kBlock);        // e_t = v_t - S̃_tᵀ k_t
  float* decays = ws.take<float>(C * K);         // exp(g_t)
  float* dS = ws.take<float>(K * kBlock);
  float* kS = ws.take<float>(kBlock);
  float* du = ws.take<float>(kBlock);
  float* de = ws.take<float>(kBlock);

  for (int64_t t = 0; t < len; ++t) {  // the V blocks accumulate into these
    const int64_t row = first + t;
    std::fill(grads.dq + row * st.qk + h * K, grads.dq + row * st.qk + h * K + K, 0.0f);
    std::fill(grads.dk + row * st.qk + h * K, grads.dk + row * st.qk + h * K + K, 0.0f);
    std::fill(grads.dg + row * st.qk + h * K, grads.dg + row * st.qk + h * K + K, 0.0f);
    grads.dbeta[row * st.beta + h] = 0.0f;
  }
  for (int64_t v0 = task.v0; v0 < task.v0 + task.width; v0 += kBlock) {
    const int64_t w = std::min(kBlock, task.v0 + task.width - v0);
    if (d_final_states) copy_rows(d_final_states[b] + h * K * V + v0, V, dS, kBlock, K, w);
    else std::fill(dS, dS + K * kBlock, 0.0f);
    for (int64_t c0 = len <= 0 ? -1 : (len - 1) / C * C; c0 >= 0; c0 -= C) {
      const int64_t c1 = std::min(len, c0 + C);
      // Recompute the chunk in one pass per token, keeping S_{t-1}, u_t, e_t and exp(g_t).
      copy_rows(saved_state(saved, shape, b, c0 / C, h) + v0, V, S, kBlock, K, w);
      const float* pending_k = nullptr;
      const float* pending_u = nullptr;
      for (int64_t t = c0; t < c1; ++t) {
        const int64_t row = first + t, slot = t - c0;
        const float* kt = in.k + row * st.qk + h * K;
        float* decay = decays + slot * K;
        std::memcpy(decay, in.g + row * st.qk + h * K, size_t(K) * sizeof(float));
        exp_inplace(decay, K);
        state_pass(S, K, w, kBlock, pending_k, pending_u, decay, kt, nullptr, kS, nullptr,
                   prev + slot * K * kBlock);
        const float* vt = in.v + row * st.v + h * V + v0;
        const float beta = in.beta[row * st.beta + h];
        for (int64_t j = 0; j < w; ++j) {
          es[slot * kBlock + j] = vt[j] - kS[j];
          us[slot * kBlock + j] = beta * es[slot * kBlock + j];
        }
        pending_k = kt;
        pending_u = us + slot * kBlock;
      }
      for (int64_t t = c1 - 1; t >= c0; --t) {
        const int64_t row = first + t, slot = t - c0;
        const float* qt = in.q + row * st.qk + h * K;
        const float* kt = in.k + row * st.qk + h * K;
        const float* dot_ = d_o + row * st.v + h * V + v0;
        const float beta = in.beta[row * st.beta + h];
        const float* P = prev + slot * K * kBlock;
        const float* decay = decays + slot * K;
        const float* u = us + slot * kBlock;
        const float* e = es + slot * kBlock;
        float* dq = grads.dq + row * st.qk + h * K;
        float* dk = grads.dk + row * st.qk + h * K;
        float* dg = grads.dg + row * st.qk + h * K;
        // o = S_tᵀq, S_t = S̃ + k uᵀ: dS += q doᵀ; dq = S_t do; dk += dS u; du = dSᵀ k.
        dispatch_width(w, [&](auto vecs, vec::Mask last) {
          backward_pass_a<decltype(vecs)::value>(P, dS, K, kBlock, decay, kt, qt, u, dot_, dq, dk, du, last);
        });
        // u = β e, e = v - S̃ᵀk.
        float* dv = grads.dv + row * st.v + h * V + v0;
        for (int64_t j = 0; j < w; ++j) {
          de[j] = beta * du[j];
          dv[j] = de[j];
        }
        grads.dbeta[row * st.beta + h] += dot(du, e, w);
        // dS̃ = dS - k deᵀ; dk -= S̃ de; dg = rowsum(S̃ ⊙ dS̃); dS_{t-1} = diag(exp g) dS̃.
        dispatch_width(w, [&](auto vecs, vec::Mask last) {
          backward_pass_b<decltype(vecs)::value>(P, dS, K, kBlock, decay, kt, de, dk, dg, last);
        });
      }
    }
    if (grads.d_initial_states) copy_rows(dS, kBlock, grads.d_initial_states[b] + h * K * V + v0, V, K, w);
  }
}

void kda_decode_step(const KdaShape& shape, int64_t batch, const float* q, const float* k, const float* v,
                     const float* g, const float* beta, float* const* states, float* o) {
  const int64_t H = shape.heads, K = shape.key_dim, V = shape.value_dim;
  HYLA_ASSERT(K <= 1024);
  parallel_for(batch * H, 1, [&](int, int64_t first, int64_t last) {
    float decay[1024], kS[kBlock], qS[kBlock];
    for (int64_t x = first; x < last; ++x) {
      const int64_t b = x / H, h = x % H;
      const float* qt = q + x * K;
      const float* kt = k + x * K;
      std::memcpy(decay, g + x * K, size_t(K) * sizeof(float));
      exp_inplace(decay, K);
      const float qk = dot(qt, kt, K);
      for (int64_t v0 = 0; v0 < V; v0 += kBlock) {
        const int64_t w = std::min(kBlock, V - v0);
        float* S = states[b] + h * K * V + v0;
        state_pass(S, K, w, V, nullptr, nullptr, decay, kt, qt, kS, qS);
        float u[kBlock];
        for (int64_t j = 0; j < w; ++j) {
          u[j] = beta[x] * (v[x * V + v0 + j] - kS[j]);
          o[x * V + v0 + j] = qS[j] + qk * u[j];
        }
        rank1_update(S, K, w, V, kt, u);
      }
    }
  });
}

}  // namespace hyla
