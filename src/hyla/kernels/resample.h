#pragma once
// Resizing a grid of vectors as PyTorch's F.interpolate(size=...) does with align_corners=False
// and no antialiasing: a vision tower's learned position embeddings, resized to an image's grid
// of patches (SPEC §7). Along each axis, output index o reads the source at s = (o + 0.5)·in/out − 0.5:
// Bicubic takes the 4 taps ⌊s⌋−1 … ⌊s⌋+2 (indices clamped to the grid) with Keys' kernel, a = −0.75;
// Bilinear takes ⌊max(s, 0)⌋ and the next (clamped) by linear weights. The axes are separable.
#include <cstdint>

namespace hyla {

enum class GridResample : uint8_t { Bicubic, Bilinear };

// src [src_h, src_w, channels] → dst [dst_h, dst_w, channels], row-major with channels innermost.
// Output rows in parallel.
void resample_grid(GridResample mode, const float* src, int64_t src_h, int64_t src_w, int64_t channels, float* dst,
                   int64_t dst_h, int64_t dst_w);

// The backward: d_src += the transpose of the resampling applied to d_dst (same layouts). Serial
// over output cells, so the sums do not depend on the threads.
void resample_grid_backward(GridResample mode, const float* d_dst, int64_t dst_h, int64_t dst_w, int64_t channels,
                            float* d_src, int64_t src_h, int64_t src_w);

}  // namespace hyla
