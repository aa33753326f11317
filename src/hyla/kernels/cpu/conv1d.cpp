#include "hyla/kernels/conv1d.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "hyla/core/team.h"

namespace hyla {
namespace {

// Row r of sequence b shifted back by `back` rows: the input row, the tail row, or null (zero).
const float* input_row(const Conv1dShape& s, const float* x, int64_t ld_x, const float* const* tails, int64_t b,
                       int64_t r, int64_t back) {
  const int64_t t = r - s.starts[b] - back;  // index within the sequence
  if (t >= 0) return x + (r - back) * ld_x;
  if (!tails || !tails[b]) return nullptr;
  return tails[b] + (s.kernel - 1 + t) * s.channels;  // t in [-(kernel-1), -1]
}

// w [channels, kernel] transposed to [kernel, channels] for contiguous channel loops. Written
// along the channels (strided reads, which the compiler gathers): the other order, a store per
// value kernel apart, was most of a decoded token's convolution time.
const float* taps_by_offset(const Conv1dShape& s, const float* w, Frame& frame) {
  float* taps = frame.take<float>(s.kernel * s.channels);
  for (int64_t j = 0; j < s.kernel; ++j)
    for (int64_t c = 0; c < s.channels; ++c) taps[j * s.channels + c] = w[c * s.kernel + j];
  return taps;
}

// One output row from w as stored, for a kernel of KERNEL taps: the taps of 16 channels are
// KERNEL vectors' worth of interleaved values, which the compiler de-interleaves in registers. A
// decoded token's row is one of this; transposing the taps first took four times as long.
template <int KERNEL>
void direct_row(const float* const (&in)[KERNEL], const float* w, int64_t channels, float* out) {
#pragma omp simd
  for (int64_t c = 0; c < channels; ++c) {
    float sum = 0.0f;
    for (int j = 0; j < KERNEL; ++j) sum += w[c * KERNEL + j] * in[j][c];
    out[c] = sum;
  }
}

// Rows that a decode step brings (a few per call): each from w as stored, zero rows for inputs
// before the sequence without a tail.
constexpr int64_t kDirectRows = 4;

}  // namespace

void causal_conv1d_forward(const Conv1dShape& s, const float* x, int64_t ld_x, const float* w,
                           const float* const* tails, float* y, int64_t ld_y, Workspace& workspace) {
  Frame frame(workspace.serial());
  if (s.kernel == 4 && s.starts[s.batch] <= kDirectRows) {
    float* zeros = frame.take<float>(s.channels);
    std::fill(zeros, zeros + s.channels, 0.0f);
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t r = s.starts[b]; r < s.starts[b + 1]; ++r) {
        const float* in[4];
        for (int j = 0; j < 4; ++j) {
          const float* row = input_row(s, x, ld_x, tails, b, r, 3 - j);
          in[j] = row ? row : zeros;
        }
        direct_row<4>(in, w, s.channels, y + r * ld_y);
      }
    return;
  }
  const float* taps = taps_by_offset(s, w, frame);
  for (int64_t b = 0; b < s.batch; ++b) {
    parallel_rows(s.starts[b + 1] - s.starts[b], s.channels * s.kernel, [&](int64_t begin, int64_t end) {
      for (int64_t r = s.starts[b] + begin; r < s.starts[b] + end; ++r) {
        float* out = y + r * ld_y;
        std::fill(out, out + s.channels, 0.0f);
        for (int64_t j = 0; j < s.kernel; ++j) {
          const float* in = input_row(s, x, ld_x, tails, b, r, s.kernel - 1 - j);
          if (!in) continue;
          const float* tap = taps + j * s.channels;
#pragma omp simd
          for (int64_t c = 0; c < s.channels; ++c) out[c] += tap[c] * in[c];
        }
      }
    });
  }
}

void causal_conv1d_backward(const Conv1dShape& s, const float* x, int64_t ld_x, const float* w, const float* dy,
                            int64_t ld_dy, float* dx, int64_t ld_dx, float* dw, Workspace& workspace) {
  Frame frame(workspace.serial());
  const float* taps = taps_by_offset(s, w, frame);
  const int threads = omp_get_max_threads();
  float* const partial = frame.take<float>(threads * s.kernel * s.channels);
  std::fill(partial, partial + threads * s.kernel * s.channels, 0.0f);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t first = s.starts[b], last = s.starts[b + 1];
#pragma omp parallel
    {
      float* dw_local = partial + omp_get_thread_num() * s.kernel * s.channels;
#pragma omp for schedule(static)
      for (int64_t r = first; r < last; ++r) {
        // dx_r = Σ_j w[:, j] ⊙ dy_{r + kernel-1-j} (the outputs that read row r).
        float* out = dx + r * ld_dx;
        std::fill(out, out + s.channels, 0.0f);
        for (int64_t j = 0; j < s.kernel; ++j) {
          const int64_t ahead = r + s.kernel - 1 - j;
          if (ahead >= last) continue;
          const float* g = dy + ahead * ld_dy;
          const float* tap = taps + j * s.channels;
#pragma omp simd
          for (int64_t c = 0; c < s.channels; ++c) out[c] += tap[c] * g[c];
        }
        // dw[:, j] += dy_r ⊙ x_{r-(kernel-1-j)}.
        const float* g = dy + r * ld_dy;
        for (int64_t j = 0; j < s.kernel; ++j) {
          const float* in = input_row(s, x, ld_x, nullptr, b, r, s.kernel - 1 - j);
          if (!in) continue;
          float* acc = dw_local + j * s.channels;
#pragma omp simd
          for (int64_t c = 0; c < s.channels; ++c) acc[c] += g[c] * in[c];
        }
      }
    }
  }
  for (int t = 0; t < threads; ++t)
    for (int64_t j = 0; j < s.kernel; ++j)
      for (int64_t c = 0; c < s.channels; ++c)
        dw[c * s.kernel + j] += partial[t * s.kernel * s.channels + j * s.channels + c];
}

void causal_conv1d_update_tails(const Conv1dShape& s, const float* x, int64_t ld_x, float* const* tails,
                                Workspace& workspace) {
  const int64_t keep = s.kernel - 1;
  if (keep == 0) return;
  Frame frame(workspace.serial());
  float* const rows = frame.take<float>(keep * s.channels);
  for (int64_t b = 0; b < s.batch; ++b) {
    // The new tail is the last `keep` inputs of [old tail ; new rows].
    const int64_t last = s.starts[b + 1];
    for (int64_t i = 0; i < keep; ++i) {
      const float* in = input_row(s, x, ld_x, tails, b, last, keep - i);
      if (in) std::memcpy(rows + i * s.channels, in, size_t(s.channels) * sizeof(float));
      else std::fill(rows + i * s.channels, rows + (i + 1) * s.channels, 0.0f);
    }
    std::memcpy(tails[b], rows, size_t(keep * s.channels) * sizeof(float));
  }
}

}  // namespace hyla
