#pragma once
// Elementwise activations (SPEC §3, §5) with their derivatives.
#include <cstdint>

namespace hyla {

// The gate of a gated MLP, act(a, b) elementwise.
struct GatedActivation {
  enum class Kind : uint8_t {
    Swiglu,  // silu(a) ⊙ b
    Situ,    // [β·tanh(a/β) ⊙ σ(a)] ⊙ [λ·tanh(b/λ)]   (λ ≤ 0: ⊙ b)
  };
  Kind kind = Kind::Swiglu;
  float situ_beta = 4.0f;          // β
  float situ_linear_beta = 25.0f;  // λ
  float swiglu_limit = 0.0f;       // L > 0 (swiglu): min(silu(a), L) ⊙ clamp(b, −L, L); the gradient is 0 where clamped
};

// gu: [rows, 2·width] holding [a | b] per row (the fused gate+up projection); h: [rows, width].
void gated_activation_forward(GatedActivation act, const float* gu, int64_t rows, int64_t width, float* h);
// Given dh [rows, width], writes dgu [rows, 2·width].
void gated_activation_backward(GatedActivation act, const float* gu, const float* dh, int64_t rows, int64_t width,
                               float* dgu);

// GELU, y = x·Φ(x): Erf exactly (PyTorch's nn.GELU()), Tanh by its approximation
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (gelu_pytorch_tanh). A vision tower's MLPs (SPEC §7).
enum class Gelu : uint8_t { Erf, Tanh };
// y = gelu(x) over n values; y may alias x.
void gelu_forward(Gelu kind, const float* x, int64_t n, float* y);
// dx = dy ⊙ gelu'(x) over n values; dx may alias dy.
void gelu_backward(Gelu kind, const float* x, const float* dy, int64_t n, float* dx);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
inline float softplus(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

// σ in place over `rows` rows of `width` values, `ld` apart; rows in parallel.
void sigmoid_rows(float* x, int64_t rows, int64_t width, int64_t ld);
// d ⊙= σ'(z) = s(1 − s), given s = σ(z) as sigmoid_rows left it: rows of `width`, s `ld_s` apart
// and d `ld_d` apart.
void sigmoid_rows_backward(const float* s, int64_t ld_s, int64_t rows, int64_t width, float* d, int64_t ld_d);

// An output gate y = x ⊙ σ(z) over rows of `width` (x and y packed), given s = σ(z) `ld_s` apart;
// each gate value scales `group` consecutive values of x (1: one per channel; a head's width: one
// per head, width / group gate values a row).
void sigmoid_gate_forward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                          float* y);
// Its backward: dz = Σ_group dy ⊙ x ⊙ s(1 − s) into d_logit (`ld_logit` apart), and dy becomes dx = dy ⊙ s.
void sigmoid_gate_backward(const float* x, const float* s, int64_t ld_s, int64_t rows, int64_t width, int64_t group,
                           float* dy, float* d_logit, int64_t ld_logit);

}  // namespace hyla
