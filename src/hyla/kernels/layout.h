#pragma once
// Moving vectors between layouts: the per-head splits and merges of attention's projections, the
// rows a cache stores, the rows a token id picks. No arithmetic beyond dtype conversion and the
// sums that are the backward of a copy (a vector read by every head, a row read by many tokens).
#include <cstdint>

#include "hyla/core/half.h"

namespace hyla {

// Where `heads` vectors of one row lie: vector h of row r starts at base + r·row_stride + h·head_stride.
// One vector per row is {row_stride, 0}.
struct HeadLayout {
  int64_t row_stride, head_stride;
};

// dst vector (r, h) = src vector (r, h), `width` values each, for rows × heads vectors; rows in
// parallel. To bf16 rounds to nearest even; from bf16 widens exactly. src and dst do not overlap.
void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout);
void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, bf16* dst,
                HeadLayout dst_layout);
void copy_heads(const bf16* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout);

// dst row r (`width` values, dst_stride apart) = Σ_h src vector (r, h), heads added in order: the
// backward of one vector copied to every head.
void sum_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
               int64_t dst_stride);

// out row j = x row ids[j], for n rows of `width` values (packed); rows in parallel.
void gather_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* out);

// y row ids[j] += x row j, for j in order; an id of −1 skips its row. The gather's backward: rows
// with the same id add in the order of j, so the result does not depend on the threads.
void scatter_add_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* y);

}  // namespace hyla
