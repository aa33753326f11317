#pragma once
// Shared pieces of the KDA paths: the per-thread arena and the task list.
#include <cstdint>
#include <memory>
#include <vector>

#include "hyla/kernels/kda.h"

namespace hyla {

// A bump allocator over one buffer per thread: a task carves its buffers at its start and
// releases them all at its end. When a task needs more than the buffer holds, the extra comes
// from overflow blocks, and release() regrows the buffer to the high-water mark: only the first
// tasks allocate.
struct KdaWorkspace::Thread {
  std::shared_ptr<void> memory;
  size_t capacity = 0;  // floats
  size_t used = 0;
  size_t overflow_used = 0;
  std::vector<std::shared_ptr<void>> overflow;
  float max_dense_exponent = 0.0f;

  void ensure(size_t floats);
  float* take(int64_t floats);  // 64-byte aligned
  void release();
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Row strides of the token-major inputs.
struct KdaStrides {
  int64_t qk, v, beta;  // H*K, H*V, H
};
inline KdaStrides strides(const KdaShape& s) { return {s.heads * s.key_dim, s.heads * s.value_dim, s.heads}; }

// Pointer to the saved state at the start of chunk `chunk` of sequence b, head h.
inline float* saved_state(const KdaSavedStates& saved, const KdaShape& s, int64_t b, int64_t chunk, int64_t h) {
  return const_cast<float*>(saved.states.data<float>()) +
         ((saved.chunk_base[size_t(b)] + chunk) * s.heads + h) * s.key_dim * s.value_dim;
}

void kda_recurrent_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                                int64_t h, float* o, float* final_state, KdaSavedStates* saved,
                                KdaWorkspace::Thread& ws);
void kda_recurrent_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                                 int64_t h, const float* d_o, const float* d_final_state,
                                 const KdaSavedStates& saved, const KdaGrads& grads, KdaWorkspace::Thread& ws);
void kda_chunked_forward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                              int64_t h, float* o, float* final_state, KdaSavedStates* saved,
                              KdaWorkspace::Thread& ws);
void kda_chunked_backward_task(const KdaShape& shape, const KdaInputs& in, const KdaOptions& options, int64_t b,
                               int64_t h, const float* d_o, const float* d_final_state, const KdaSavedStates& saved,
                               const KdaGrads& grads, KdaWorkspace::Thread& ws);

}  // namespace hyla
