#include "hyla/kernels/rope.h"

#include <cmath>

#include "hyla/core/error.h"
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

void rope_table_2d(const int64_t* rows, const int64_t* columns, int64_t n, int64_t dim, double theta, float* table) {
  HYLA_CHECK(dim > 0 && dim % 4 == 0, "2-D rotary positions need a head width that is a multiple of 4, got {}", dim);
  const int64_t pairs = dim / 2;
  const double log_theta = std::log(theta);
  parallel_rows(n, 4 * pairs, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t p = 0; p < pairs; ++p) {
        const double position = double(p % 2 == 0 ? columns[r] : rows[r]);
        const double angle = position * std::exp(-4.0 * double(p / 2) / double(dim) * log_theta);
        table[r * dim + p] = float(std::cos(angle));
        table[r * dim + pairs + p] = float(std::sin(angle));
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
