#pragma once
// The residual stream's two elementwise steps (SPEC §2, §6), over rows × cols floats (row-major,
// contiguous): a sublayer's output joins the stream as a new entry, and in the backward that
// entry's gradient also flows to the entry it was added to. Their own header rather than
// vmath.h: these are whole-tensor kernels a layer calls (rows run in parallel), where vmath.h
// holds single-threaded inner-loop helpers.
#include <cstdint>

namespace hyla {

// y = x + base; base may be nullptr (a sublayer that starts a new partial sum), then y = x + 0.
// y may alias x or base.
void add_rows(const float* x, const float* base, int64_t rows, int64_t cols, float* y);

// y += x.
void accumulate_rows(const float* x, int64_t rows, int64_t cols, float* y);

}  // namespace hyla
