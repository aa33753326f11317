#pragma once
// The gated delta rule with per-channel decay (SPEC §3), per sequence and head:
//
//   S̃ = diag(exp(g_t)) S_{t-1}           g_t ∈ R^K, g_t <= 0 (log decay per key channel)
//   e = v_t - S̃ᵀ k_t
//   S_t = S̃ + β_t k_t eᵀ                  S ∈ R^{K×V}, f32
//   o_t = S_tᵀ q_t
//
// Three evaluation paths compute the same function:
//   Recurrent        token by token: the definition, the test oracle and the decode step.
//   ChunkedDense     chunks of C tokens in 16-token sub-chunks (WY/UT form) where every
//                    intra-chunk block is a dense matrix product. Needs the lower-bounded gate
//                    (g >= lb >= -5): within a sub-chunk the decay exponents offset at the
//                    sub-chunk's first token stay within 15·|lb| <= 75 nats, inside f32/bf16 range.
//   ChunkedPairwise  the same chunks for any gate (e.g. softplus): the diagonal sub-blocks take the
//                    pairwise exp(Γ_i - Γ_j) path, masked before exponentiating.
// Inputs are token-major over a packed batch of sequences; sequence b owns rows [starts[b], starts[b+1]).
#include <cstdint>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/core/workspace.h"

namespace hyla {

enum class KdaPath : uint8_t { Recurrent, ChunkedDense, ChunkedPairwise };
const char* to_string(KdaPath p);

struct KdaShape {
  int64_t heads;      // H
  int64_t key_dim;    // K
  int64_t value_dim;  // V
};

struct KdaInputs {
  int64_t batch;                // sequences
  const int64_t* starts;        // batch + 1 row offsets
  const float* q;               // [N, H, K], L2-normalised and scaled by K^{-1/2}
  const float* k;               // [N, H, K], L2-normalised
  const float* v;               // [N, H, V]
  const float* g;               // [N, H, K], log decay <= 0
  const float* beta;            // [N, H]
  // One [H, K, V] state per sequence (e.g. each sequence's cache), or nullptr for zeros.
  const float* const* initial_states;
};

struct KdaOptions {
  KdaPath path = KdaPath::ChunkedDense;
  int64_t chunk_size = 64;        // tokens per chunk (and per saved state); a multiple of 16
  bool bf16_matmul = false;       // round the chunked paths' matrix-product inputs to bf16
  float gate_lower_bound = -5.0f; // ChunkedDense: the bound its exponent range relies on
};

struct KdaGrads {
  float* dq;               // [N, H, K]
  float* dk;               // [N, H, K]
  float* dv;               // [N, H, V]
  float* dg;               // [N, H, K]
  float* dbeta;            // [N, H]
  float* const* d_initial_states;  // one [H, K, V] per sequence, or nullptr when not wanted
};

// The state at the start of every chunk of every (sequence, head), kept by a forward for its
// backward (per-chunk states are recomputed into, never per-token ones). Owned by the caller
// (e.g. a layer), since several layers share one workspace.
struct KdaSavedStates {
  Tensor states;                   // [total chunks, H, K, V]
  std::vector<int64_t> chunk_base; // first chunk index of each sequence
};

// Forward. `final_states` (one [H, K, V] per sequence; may equal initial_states, for an in-place
// update of a cache) may be nullptr; `saved` may be nullptr (inference). Scratch comes from
// `workspace`'s per-thread arenas. Returns the largest exponent (nats) a ChunkedDense sub-block
// used, at most 15·|lb| (0 on the other paths).
float kda_forward(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, float* o,
                  float* const* final_states, KdaSavedStates* saved, Workspace& workspace);

// Backward of kda_forward on the same inputs, given dL/do (and dL/d final states, may be null).
// Gradients are written (not accumulated).
void kda_backward(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, const float* d_o,
                  const float* const* d_final_states, const KdaSavedStates& saved, const KdaGrads& grads,
                  Workspace& workspace);

// One decode step: one token for each of `batch` sequences, whose [H, K, V] states are updated
// in place; q, k, g [batch, H, K], v [batch, H, V], beta [batch, H], o [batch, H, V].
void kda_decode_step(const KdaShape& shape, int64_t batch, const float* q, const float* k, const float* v,
                     const float* g, const float* beta, float* const* states, float* o);

// Pointers to `batch` consecutive [H, K, V] states in one buffer.
std::vector<float*> kda_state_pointers(float* states, int64_t batch, const KdaShape& shape);

// The faster path for a head shape on CPU, from `hyla bench kda` (BENCHMARKS.md, 2 Zen 5 cores):
// with the state block in L1 the recurrence is not memory-bound, so it wins the forward for
// head dims up to 128 (f32 chunk products) or 64 (bf16); with a backward, the chunked path wins
// from head dim 32 up under the lower-bounded gate. Under the unbounded gate the pairwise path
// pays its exponentials and loses to the recurrence up to head dim 64 in training too.
KdaPath kda_fastest_path(int64_t key_dim, int64_t value_dim, bool backward, bool bf16_matmul, bool lower_bounded_gate);

// FLOPs of one forward / backward of each path for T tokens of one head (for benchmarks and MFU).
double kda_forward_flops(KdaPath path, int64_t tokens, int64_t key_dim, int64_t value_dim, int64_t chunk);
double kda_backward_flops(KdaPath path, int64_t tokens, int64_t key_dim, int64_t value_dim, int64_t chunk);

}  // namespace hyla
