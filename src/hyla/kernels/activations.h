#pragma once
// Elementwise activations (SPEC §3, §5) with their derivatives.
#include <cstdint>

namespace hyla {

enum class GatedActivation : uint8_t {
  Swiglu,  // silu(a) ⊙ b
  Situ,    // [4·tanh(a/4) ⊙ σ(a)] ⊙ [25·tanh(b/25)]
};

// gu: [rows, 2·width] holding [a | b] per row (the fused gate+up projection); h: [rows, width].
void gated_activation_forward(GatedActivation act, const float* gu, int64_t rows, int64_t width, float* h);
// Given dh [rows, width], writes dgu [rows, 2·width].
void gated_activation_backward(GatedActivation act, const float* gu, const float* dh, int64_t rows, int64_t width,
                               float* dgu);

inline float sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
inline float softplus(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

// In place over n values.
void sigmoid_inplace(float* x, int64_t n);
void silu_inplace(float* x, int64_t n);

}  // namespace hyla
