#include "hyla/kernels/rope.h"

#include <cmath>

#include "hyla/core/team.h"

namespace hyla {
namespace {

// sign = +1 rotates by the table's angles, −1 by their negatives.
void rotate(const float* table, int64_t rows, int64_t heads, int64_t dim, const float* x, HeadLayout lx, float* y,
            HeadLayout ly, float sign) {
  const int64_t pairs = dim / 2;
  parallel_rows(rows, heads * dim, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* cos = table + r * dim;
      const float* sin = cos + pairs;
      for (int64_t h = 0; h < heads; ++h) {
        const float* in = x + r * lx.row_stride + h * lx.head_stride;
        float* out = y + r * ly.row_stride + h * ly.head_stride;
#pragma omp simd
        for (int64_t i = 0; i < pairs; ++i) {
          const float x0 = in[2 * i], x1 = in[2 * i + 1], c = cos[i], s = sign * sin[i];
          out[2 * i] = x0 * c - x1 * s;
          out[2 * i + 1] = x0 * s + x1 * c;
        }
      }
    }
  });
}

}  // namespace

void rope_table(const int64_t* positions, int64_t rows, int64_t dim, double theta, float* table) {
  const int64_t pairs = dim / 2;
  const double log_theta = std::log(theta);
  // A pair's exponential, cosine and sine weigh about four simple operations.
  parallel_rows(rows, 4 * pairs, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const double position = double(positions[r]);
      for (int64_t i = 0; i < pairs; ++i) {
        const double angle = position * std::exp(-2.0 * double(i) / double(dim) * log_theta);
        table[r * dim + i] = float(std::cos(angle));
        table[r * dim + pairs + i] = float(std::sin(angle));
      }
    }
  });
}

void rope_forward(const float* table, int64_t rows, int64_t heads, int64_t dim, const float* x, HeadLayout x_layout,
                  float* y, HeadLayout y_layout) {
  rotate(table, rows, heads, dim, x, x_layout, y, y_layout, 1.0f);
}

void rope_backward(const float* table, int64_t rows, int64_t heads, int64_t dim, const float* dy,
                   HeadLayout dy_layout, float* dx, HeadLayout dx_layout) {
  rotate(table, rows, heads, dim, dy, dy_layout, dx, dx_layout, -1.0f);
}

}  // namespace hyla
