#pragma once
// The pointwise steps of the KDA mixer (SPEC §3) on either side of the delta rule (kda.h), with
// their backward. Before it, "prepare" turns the short convs' outputs and the gate logits of the
// fused projection into the delta rule's inputs, per token row and head h:
//   q, k, v = silu(conv outputs)
//   q_h ← q_h / sqrt(Σ q_h² + 1e-6) · K^{-1/2},   k_h ← k_h / sqrt(Σ k_h² + 1e-6)
//   z = f + dt_bias,  a_h = exp(A_log[h]):   g = lb · σ(a_h z)   (lower-bounded gate)
//                                            g = −a_h · softplus(z)   (softplus gate)
//   β = σ(b)
// After it, the output gate: gated = normed ⊙ σ(gate logits), normed the per-head RMSNorm of o.
// The logits f, b and the output gate's are columns of the fused projection's rows, read (and
// their gradients written) in place at that row stride. Rows run in parallel; nothing allocates.
#include <cstdint>

namespace hyla {

struct KdaPrepareShape {
  int64_t rows;      // N tokens
  int64_t heads;     // H
  int64_t head_dim;  // K (= V); every [N, H·K] plane below is dense
  int64_t ld_proj;   // row stride of f, b and of their gradients (the fused projection's rows)
};

struct KdaDecayGate {
  bool lower_bounded;    // g = lb·σ(a z); else g = −a·softplus(z)
  float lower_bound;     // lb
  const float* a_log;    // [H]
  const float* dt_bias;  // [H·K]
};

struct KdaPrepareInputs {
  const float* conv;  // [N, 3·H·K]: the q, k, v conv outputs of each row, before silu
  const float* f;     // [N, H·K] decay logits, rows ld_proj apart
  const float* b;     // [N, H] β logits, rows ld_proj apart
};

// What the forward writes and its backward reads again.
struct KdaPrepared {
  float *q, *k, *v;  // [N, H·K] each
  float* inv_norm;   // [N, 2H]: 1/sqrt(Σx² + 1e-6) of each head of q, then of each head of k
  float* g;          // [N, H·K] log decay, < 0
  float* beta;       // [N, H]
};

// The delta rule's gradients (kda_backward's dq dk dv dg dβ).
struct KdaPrepareGrads {
  const float *dq, *dk, *dv, *dg;  // [N, H·K]
  const float* dbeta;              // [N, H]
};

// What the prepare backward produces. d_conv, df and db are written; d_a_log and d_dt_bias are
// parameter gradients and are added to.
struct KdaPrepareInputGrads {
  float* d_conv;     // [N, 3·H·K], rows ld_proj apart: d(q, k, v conv outputs), where the conv backward reads them
  float* df;         // [N, H·K], rows ld_proj apart
  float* db;         // [N, H], rows ld_proj apart
  float* d_a_log;    // [H]
  float* d_dt_bias;  // [H·K]
};

void kda_prepare_forward(const KdaPrepareShape& s, const KdaDecayGate& gate, const KdaPrepareInputs& in,
                         const KdaPrepared& out);

// Backward of kda_prepare_forward from its inputs and outputs. The parameter sums run in a fixed
// order (dt_bias by 16-column blocks over rows; A_log over rows in double), whatever the threads.
void kda_prepare_backward(const KdaPrepareShape& s, const KdaDecayGate& gate, const KdaPrepareInputs& in,
                          const KdaPrepared& saved, const KdaPrepareGrads& grads, const KdaPrepareInputGrads& out);

// gated = normed ⊙ σ(logits) over rows × width; logits rows ld_logits apart.
void kda_output_gate_forward(const float* normed, const float* logits, int64_t ld_logits, int64_t rows,
                             int64_t width, float* gated);

// Given d_gated, writes d_normed (may alias d_gated) and d_logits (rows ld_logits apart, as the logits).
void kda_output_gate_backward(const float* normed, const float* logits, int64_t ld_logits, int64_t rows,
                              int64_t width, const float* d_gated, float* d_normed, float* d_logits);

}  // namespace hyla
