#pragma once
// Shared pieces of the KDA paths: the task list and the saved-state layout. A task takes its
// scratch from its thread's arena (core/workspace.h) inside a Frame the driver opens per task.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "hyla/core/arith.h"
#include "hyla/core/workspace.h"
#include "hyla/kernels/kda.h"

namespace hyla {

// Row strides of the token-major inputs.
struct KdaStrides {
  int64_t qk, v, beta;  // H*K, H*V, H
};
inline KdaStrides strides(const KdaShape& s) { return {s.heads * s.key_dim, s.heads * s.value_dim, s.heads}; }

// One unit of parallel work: sequence b, head h, state columns [v0, v0 + width). The columns of
// a state evolve independently, so a (sequence, head) is split by columns when there are fewer
// (sequence, head) pairs than threads; the K-side work is then repeated per split, and the
// backward's dq, dk, dg, dβ are partial sums over the splits, reduced afterwards.
struct KdaTask {
  int64_t b, h, v0, width;
  int64_t split;  // index of the column range among the pair's splits
};

// Pointer to the saved state at the start of chunk `chunk` of sequence b, head h (row stride V).
inline float* saved_state(const KdaSavedStates& saved, const KdaShape& s, int64_t b, int64_t chunk, int64_t h) {
  return const_cast<float*>(saved.states.data<float>()) +
         ((saved.chunk_base[size_t(b)] + chunk) * s.heads + h) * s.key_dim * s.value_dim;
}

inline void copy_rows(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, size_t(cols) * sizeof(float));
}

void kda_recurrent_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                                const KdaTask& task, float* o, float* const* final_states, KdaSavedStates* saved,
                                Arena& ws);
void kda_recurrent_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                                 const KdaTask& task, const float* d_o, const float* const* d_final_states,
                                 const KdaSavedStates& saved, const KdaGrads& grads, Arena& ws);
// Returns the largest exponent a dense sub-block used (0 on the pairwise path).
float kda_chunked_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                              const KdaTask& task, float* o, float* const* final_states, KdaSavedStates* saved,
                              Arena& ws);
void kda_chunked_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options,
                               const KdaTask& task, const float* d_o, const float* const* d_final_states,
                               const KdaSavedStates& saved, const KdaGrads& grads, Arena& ws);

}  // namespace hyla
