#pragma once
// The reference backend: the ops of the kernel interface (hyla/kernels/backend.h) as plain loops
// in double precision, with the fast ops' own signatures, so that a test runs hyla::op and
// hyla::reference::op on the same arguments (tests/test_backend_ops.cpp compares every op so).
// Every sum and intermediate is a double and each output is rounded to f32 once, so a reference
// output is the exact result to f32 rounding. The fast ops' precision switches (bf16 products,
// KDA's evaluation paths) are ignored: the reference is the function they approximate. Where a
// test differentiates an op numerically, the double-precision function underneath is declared too,
// on double inputs. Nothing here is parallel or fast: tests keep the shapes small.
#include <cstdint>
#include <vector>

#include "hyla/core/half.h"
#include "hyla/core/workspace.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/attention.h"
#include "hyla/kernels/attn_res.h"
#include "hyla/kernels/balancing.h"
#include "hyla/kernels/conv1d.h"
#include "hyla/kernels/kda.h"
#include "hyla/kernels/kda_gates.h"
#include "hyla/kernels/latent_attention.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/matmul.h"
#include "hyla/kernels/moe.h"
#include "hyla/kernels/rope.h"

namespace hyla::reference {

// ---- matrix products (matmul.h, small_gemm.h, skinny_gemm.h) ----

inline double as_double(float x) { return x; }
inline double as_double(bf16 x) { return to_f32(x); }

// T is float or bf16, as in the fast overloads. With beta == 0, C is not read (it may hold NaN),
// as in BLAS. Calls between reference ops are qualified: an argument of a hyla type (Trans) would
// otherwise bring the fast hyla::gemm into overload resolution, where it beats the template.
template <typename T>
void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += as_double(ta == Trans::N ? A[i * lda + k] : A[k * lda + i]) *
             as_double(tb == Trans::N ? B[k * ldb + j] : B[j * ldb + k]);
      float& out = C[i * ldc + j];
      out = float(double(alpha) * s + (beta == 0 ? 0.0 : double(beta) * out));
    }
}

template <typename T>
void gemm_batched(int64_t batch, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A,
                  int64_t lda, int64_t stride_a, const T* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                  int64_t ldc, int64_t stride_c) {
  for (int64_t b = 0; b < batch; ++b)
    reference::gemm(ta, tb, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta, C + b * stride_c,
                    ldc);
}

// skinny_gemm is x · Wᵀ.
template <typename T>
void skinny_gemm(int64_t M, int64_t N, int64_t K, float alpha, const T* x, int64_t ldx, const T* W, int64_t ldw,
                 float beta, float* y, int64_t ldy) {
  reference::gemm(Trans::N, Trans::T, M, N, K, alpha, x, ldx, W, ldw, beta, y, ldy);
}

void small_gemm(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// A and B rounded to bf16 (to_bf16), then the exact product; `scratch` is not used.
void small_gemm_bf16(bool trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc, void* scratch);

// ---- per-row steps (norm.h, activations.h, rope.h, conv1d.h, residual.h) ----

void rmsnorm_forward(const float* x, int64_t ld_x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                     int64_t ld_y, float* rstd);

// Mean and variance in double, two passes.
void layernorm_forward(const float* x, int64_t ld_x, const float* w, const float* b, int64_t rows, int64_t dim,
                       float eps, float* y, int64_t ld_y, float* stats);

void gated_activation_forward(GatedActivation act, const float* gu, int64_t rows, int64_t width, float* h);
void gelu_forward(Gelu kind, const float* x, int64_t n, float* y);
void sigmoid_rows(float* x, int64_t rows, int64_t width, int64_t ld);
void sigmoid_rows_backward(const float* s, int64_t ld_s, int64_t rows, int64_t width, float* d, int64_t ld_d);
void sigmoid_gate_forward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                          float* y);
void sigmoid_gate_backward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                           float* dy,
                           float* d_logit, int64_t ld_logit);

// Angles pos·θ^(−2i/dim) in double, as the SPEC writes them.
void rope_table(const int64_t* positions, int64_t rows, int64_t dim, double theta, float* table);
void rope_forward(const float* table, int64_t rows, int64_t heads, int64_t dim, const float* x, HeadLayout x_layout,
                  float* y, HeadLayout y_layout);
// Pair 2i by column·θ^(−4i/dim), pair 2i+1 by row·θ^(−4i/dim), as SPEC §7 writes them.
void rope_table_2d(const int64_t* rows, const int64_t* columns, int64_t n, int64_t dim, double theta, float* table);

void causal_conv1d_forward(const Conv1dShape& s, const float* x, int64_t ld_x, const float* w,
                           const float* const* tails, float* y, int64_t ld_y, Workspace& workspace);

void add_rows(const float* x, const float* base, int64_t rows, int64_t cols, float* y);

// ---- copies between layouts (layout.h) ----

void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout);
void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, bf16* dst,
                HeadLayout dst_layout);
void copy_heads(const bf16* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout);
void sum_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
               int64_t dst_stride);
void gather_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* out);
void scatter_add_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* y);

// ---- the attention residuals (attn_res.h) ----

void attn_res_forward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                      const float* norm_weight, float eps, float* weights, float* out, Workspace& workspace);
// The analytic gradients, through the given softmax weights.
void attn_res_backward(const float* const* sources, int64_t count, int64_t rows, int64_t dim, const float* query,
                       const float* norm_weight, float eps, const float* weights, const float* d_out,
                       float* const* source_grads, float* d_query, float* d_norm_weight, Workspace& workspace);

// ---- the MoE (moe.h) ----

// A tie of scores + bias (in double) goes to the lower expert id, as in the fast op.
void select_experts(const float* scores, const float* bias, int64_t n, int64_t experts, int64_t k, float scaling,
                    int32_t* selected, float* weights);
void routing_weights_backward(const float* scores, const int32_t* selected, const float* weights, int64_t n,
                              int64_t experts, int64_t k, float scaling, const float* d_weights, float* d_scores);

void routed_output_backward(const float* h, const float* routing_weight, int64_t rows, int64_t width, float* dh,
                            float* weighted_h, float* d_weight);
void combine_expert_rows(const float* slot_rows, int64_t width, const int32_t* token_slot, const float* slot_weight,
                         int64_t tokens, int64_t k, bool accumulate, float* y);

// ---- load balancing (balancing.h) ----

void quantile_margins(const float* scores, const float* bias, const int32_t* selected, int64_t tokens, int64_t experts,
                      int64_t k, float* margins);
void margin_histograms(const float* margins, int64_t tokens, int64_t experts, float lo, float bin_width, int64_t bins,
                       int64_t* counts);
// A full sort of each column; scratch is not used.
void kth_largest_per_column(const float* values, int64_t rows, int64_t cols, int64_t rank, float* scratch,
                            float* out);
double aux_loss_sum(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k);
void aux_loss_sum_backward(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k,
                           float c, float* d_scores);

// ---- weight quantisation (int8_gemm.h) ----

void quantize_int8_weights(const float* w, int64_t rows, int64_t cols, int64_t block, int8_t* values, float* scales);

// ---- the loss (cross_entropy.h) ----

double cross_entropy_loss(const float* logits, int64_t rows, int64_t classes, const int32_t* targets,
                          const float* weights, float logit_scale = 1.0f);
double cross_entropy_loss(const double* logits, int64_t rows, int64_t classes, const int32_t* targets,
                          const float* weights, float logit_scale = 1.0f);

// ---- the KDA mixer (kda.h, kda_gates.h) ----

// The recurrence of kda.h's header, token by token. `saved` must be null (the reference has no
// backward to keep states for); returns 0, as kda_forward does on its paths without sub-block
// exponents.
float kda_forward(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, float* o,
                  float* const* final_states, KdaSavedStates* saved, Workspace& workspace);

// kda_forward's inputs in double, dense in its layouts: q, k, g [N, H, K], v [N, H, V], beta [N, H],
// and all sequences' initial states [batch, H, K, V].
struct KdaDoubleInputs {
  std::vector<double> q, k, v, g, beta, initial_states;
};
// The recurrence in double: o [N, H, V] and the final states [batch, H, K, V].
void kda_recurrence(const KdaShape& shape, int64_t batch, const int64_t* starts, const KdaDoubleInputs& in,
                    std::vector<double>& o, std::vector<double>& final_states);

void kda_prepare_forward(const KdaPrepareShape& s, const KdaDecayGate& gate, const KdaPrepareInputs& in,
                         const KdaPrepared& out);

// kda_prepare_forward's inputs as doubles at the same strides (f and b rows s.ld_proj apart).
struct KdaPrepareDoubleInputs {
  const double *conv, *f, *b, *a_log, *dt_bias;
};
// Its outputs, dense in KdaPrepared's layouts.
struct KdaPreparedDouble {
  std::vector<double> q, k, v, inv_norm, g, beta;
};
KdaPreparedDouble kda_prepare(const KdaPrepareShape& s, bool lower_bounded, double lower_bound,
                              const KdaPrepareDoubleInputs& in);

void kda_output_gate_forward(const float* normed, const float* logits, int64_t ld_logits, int64_t rows,
                             int64_t width, float* gated);
void kda_output_gate_forward(const double* normed, const double* logits, int64_t ld_logits, int64_t rows,
                             int64_t width, double* gated);

// ---- attention (attention.h, latent_attention.h) ----

// The full softmax of each query row over the keys it sees.
void attention_forward(const AttentionDims& dims, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                       const float* q, const float* k, const float* v, float* o, float* lse,
                       Workspace& workspace);

// attention_forward's function on double inputs (its layouts), and given d_o the analytic
// gradients of the loss Σ d_o ⊙ o (zeros without).
struct AttentionDouble {
  std::vector<double> o, lse, dq, dk, dv;
};
AttentionDouble attention(const AttentionDims& dims, int64_t batch, const int64_t* q_starts, const int64_t* k_starts,
                          const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                          const float* d_o);

void latent_attention_decode(const LatentAttentionDims& dims, int64_t batch, const LatentCacheRows* caches,
                             const float* q, float* o, Workspace& workspace);

}  // namespace hyla::reference
