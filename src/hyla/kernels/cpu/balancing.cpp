#include "hyla/kernels/balancing.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "hyla/core/team.h"

namespace hyla {

void quantile_margins(const float* scores, const float* bias, const int32_t* selected, int64_t tokens, int64_t experts,
                      int64_t k, float* margins) {
  const int64_t E = experts;
  parallel_rows(tokens, E * (k + 1), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* s = scores + t * E;
      float alpha = -INFINITY;
      for (int64_t e = 0; e < E; ++e) {
        bool chosen = false;
        for (int64_t i = 0; i < k; ++i) chosen |= selected[t * k + i] == e;
        if (!chosen) alpha = std::max(alpha, s[e] + bias[e]);
      }
      for (int64_t e = 0; e < E; ++e) margins[t * E + e] = s[e] - alpha;
    }
  });
}

void margin_histograms(const float* margins, int64_t tokens, int64_t experts, float lo, float bin_width, int64_t bins,
                       int64_t* counts) {
  parallel_rows(experts, tokens, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      int64_t* row = counts + e * bins;
      std::fill(row, row + bins, 0);
      for (int64_t t = 0; t < tokens; ++t) {
        const int64_t bin = int64_t(std::floor((margins[t * experts + e] - lo) / bin_width));
        ++row[std::clamp<int64_t>(bin, 0, bins - 1)];
      }
    }
  });
}

void kth_largest_per_column(const float* values, int64_t rows, int64_t cols, int64_t rank, float* scratch,
                            float* out) {
  parallel_rows(cols, rows * 4, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      float* column = scratch + c * rows;
      for (int64_t r = 0; r < rows; ++r) column[r] = values[r * cols + c];
      std::nth_element(column, column + rank - 1, column + rows, std::greater<float>());
      out[c] = column[rank - 1];
    }
  });
}

double aux_loss_sum(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k) {
  // Fixed parts, each summed on one thread, then added in order: no dependence on the threads.
  constexpr int64_t kParts = 64;
  double part_sums[kParts] = {};
  const double inv_slots = 1.0 / double(tokens * k);
  parallel_rows(kParts, tokens * experts / kParts + 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t t = tokens * p / kParts; t < tokens * (p + 1) / kParts; ++t) {
        double f_dot_s = 0.0, total = 0.0;
        for (int64_t e = 0; e < experts; ++e) {
          f_dot_s += double(load[e]) * scores[t * experts + e];
          total += scores[t * experts + e];
        }
        part_sums[p] += f_dot_s * inv_slots / total;
      }
  });
  double sum = 0.0;
  for (double part : part_sums) sum += part;
  return sum;
}

void aux_loss_sum_backward(const float* scores, const int64_t* load, int64_t tokens, int64_t experts, int64_t k,
                           float c, float* d_scores) {
  const float inv_slots = 1.0f / float(tokens * k);
  parallel_rows(tokens, 2 * experts, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* s = scores + t * experts;
      float f_dot_s = 0.0f, total = 0.0f;
      for (int64_t e = 0; e < experts; ++e) {
        f_dot_s += float(load[e]) * inv_slots * s[e];
        total += s[e];
      }
      const float mean = f_dot_s / total, g = c / total;
      for (int64_t e = 0; e < experts; ++e) d_scores[t * experts + e] += g * (float(load[e]) * inv_slots - mean);
    }
  });
}

}  // namespace hyla
