#include "hyla/kernels/layout.h"

#include <algorithm>
#include <cstring>

#include "hyla/core/team.h"

namespace hyla {
namespace {

void copy_vector(const float* src, float* dst, int64_t width) { std::memcpy(dst, src, size_t(width) * sizeof(float)); }
void copy_vector(const float* src, bf16* dst, int64_t width) { convert(src, dst, size_t(width)); }
void copy_vector(const bf16* src, float* dst, int64_t width) { convert(src, dst, size_t(width)); }

template <typename From, typename To>
void copy_heads_as(const From* src, HeadLayout ls, int64_t rows, int64_t heads, int64_t width, To* dst, HeadLayout ld) {
  parallel_rows(rows, heads * width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t h = 0; h < heads; ++h)
        copy_vector(src + r * ls.row_stride + h * ls.head_stride, dst + r * ld.row_stride + h * ld.head_stride, width);
  });
}

}  // namespace

void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout) {
  copy_heads_as(src, src_layout, rows, heads, width, dst, dst_layout);
}

void copy_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, bf16* dst,
                HeadLayout dst_layout) {
  copy_heads_as(src, src_layout, rows, heads, width, dst, dst_layout);
}

void copy_heads(const bf16* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
                HeadLayout dst_layout) {
  copy_heads_as(src, src_layout, rows, heads, width, dst, dst_layout);
}

void sum_heads(const float* src, HeadLayout src_layout, int64_t rows, int64_t heads, int64_t width, float* dst,
               int64_t dst_stride) {
  parallel_rows(rows, heads * width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* sum = dst + r * dst_stride;
      std::fill(sum, sum + width, 0.0f);
      for (int64_t h = 0; h < heads; ++h) {
        const float* x = src + r * src_layout.row_stride + h * src_layout.head_stride;
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) sum[i] += x[i];
      }
    }
  });
}

void gather_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* out) {
  parallel_rows(n, width, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) copy_vector(x + int64_t(ids[j]) * width, out + j * width, width);
  });
}

void scatter_add_rows(const float* x, int64_t width, const int32_t* ids, int64_t n, float* y) {
  // Columns split across threads: no two threads add to one element, and each element's rows add in order.
  constexpr int64_t kColumns = 16;
  parallel_rows((width + kColumns - 1) / kColumns, n * kColumns, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kColumns, last = std::min(width, end * kColumns);
    for (int64_t j = 0; j < n; ++j) {
      if (ids[j] < 0) continue;
      const float* row = x + j * width;
      float* out = y + int64_t(ids[j]) * width;
      for (int64_t c = first; c < last; ++c) out[c] += row[c];
    }
  });
}

}  // namespace hyla
