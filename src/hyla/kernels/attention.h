#pragma once
// Blocked causal (or bidirectional) attention with online softmax (flash-attention-2 style) on the CPU, forward and
// backward, for the latent-attention mixer (SPEC §4) in training and prefill. Never forms a T×T
// matrix; tiles a query sees no key of are skipped, so a sliding window costs O(T·window).
// Kernels take plain pointers and shapes; their scratch memory (task lists, per-thread tiles)
// comes from the caller's Workspace (core/workspace.h), so steady-state calls allocate nothing.
// See docs/kernels-attention.md.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hyla/core/workspace.h"

namespace hyla {

struct AttentionDims {
  int64_t heads;   // H
  int64_t qk_dim;  // Dqk: query/key width per head (e.g. 64, or Dn + Dr = 192)
  int64_t v_dim;   // Dv: value/output width per head (may differ from Dqk)
  int64_t window;  // 0 = full causal; else query at position t sees key s iff s <= t and t - s < window
  float scale;     // scores = scale * q.k
  // Forward only: round q, k, v and the probabilities to bf16 for the block products (f32
  // accumulation; masks, softmax, max and sums stay f32). Measured 1.45-1.75x faster, with errors
  // ~3e-3 of the output scale. attention_backward rejects it.
  bool bf16_products = false;
  // false: bidirectional, every query sees every key of its sequence (a vision tower's attention
  // within one image); needs q_len == kv_len and window 0.
  bool causal = true;
};

// Packed variable-length batch of `batch` sequences. Sequence b owns query rows
// [q_starts[b], q_starts[b+1]) and key/value rows [k_starts[b], k_starts[b+1]); its queries are its
// LAST q_len tokens: query i has position kv_len - q_len + i and sees keys by the window rule
// (q_len == kv_len in training, q_len < kv_len for chunked prefill on a cache, q_len == 1 for a
// decode step). A query with a negative position (q_len > kv_len) sees no key: its output is 0,
// its lse is -inf and its gradients are 0. Row-major layouts: q [Nq, H, Dqk], k [Nk, H, Dqk],
// v [Nk, H, Dv], o [Nq, H, Dv], lse [Nq, H] (natural-log log-sum-exp of the scaled scores, kept
// for the backward pass).
void attention_forward(const AttentionDims& dims, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                       const float* q, const float* k, const float* v, float* o, float* lse,
                       Workspace& workspace);

// Given o and lse from the forward pass and dO: writes dq [Nq, H, Dqk], dk [Nk, H, Dqk] and
// dv [Nk, H, Dv] (overwriting). Probabilities are recomputed from lse, never stored.
void attention_backward(const AttentionDims& dims, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                        const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* d_o, float* dq, float* dk, float* dv, Workspace& workspace);

// Whether a forward whose caller allows bf16 rounding (`allowed`: no backward follows) is fastest
// with bf16_products: where they run on this machine's bf16 dot-product instructions. Emulated
// they are slower than the f32 products and less exact. The one place this choice is made.
bool attention_use_bf16_products(bool allowed);

}  // namespace hyla
