#pragma once
// Causal depthwise 1-D convolution over packed sequences (SPEC §3's short convs):
//   y_t[c] = Σ_{j<kernel} w[c, j] · x_{t-kernel+1+j}[c]
// where inputs before a sequence's first row come from that sequence's tail (its previous
// kernel-1 inputs, oldest first: a decode cache) or are zero.
#include <cstdint>

#include "hyla/core/workspace.h"

namespace hyla {

struct Conv1dShape {
  int64_t channels, kernel;
  int64_t batch;         // sequences
  const int64_t* starts; // batch + 1 row offsets
};

// x rows ld_x apart, y rows ld_y apart; w [channels, kernel]; tails: nullptr (zeros) or one
// [kernel-1, channels] buffer per sequence. Scratch (the taps by offset) from `workspace`.
void causal_conv1d_forward(const Conv1dShape& s, const float* x, int64_t ld_x, const float* w,
                           const float* const* tails, float* y, int64_t ld_y, Workspace& workspace);
// Given dy, writes dx (zero-tail forward) and adds to dw [channels, kernel].
void causal_conv1d_backward(const Conv1dShape& s, const float* x, int64_t ld_x, const float* w, const float* dy,
                            int64_t ld_dy, float* dx, int64_t ld_dx, float* dw, Workspace& workspace);
// After a forward over new rows, shifts each sequence's tail to its last kernel-1 inputs.
void causal_conv1d_update_tails(const Conv1dShape& s, const float* x, int64_t ld_x, float* const* tails,
                                Workspace& workspace);

}  // namespace hyla
