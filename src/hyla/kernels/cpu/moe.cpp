#include "hyla/kernels/moe.h"

#include <algorithm>
#include <cstring>

#include "hyla/core/team.h"
#include "hyla/kernels/cpu/vmath.h"

namespace hyla {

void routed_output_backward(const float* h, const float* routing_weight, int64_t rows, int64_t width, float* dh,
                            float* weighted_h, float* d_weight) {
  const int64_t w = width;
  for (int64_t j = 0; j < rows; ++j) {
    float* dh_row = dh + j * w;
    float* weighted_row = weighted_h + j * w;
    const float c = routing_weight[j];
    d_weight[j] = dot(dh_row, h + j * w, w);
    for (int64_t r = 0; r < w; ++r) dh_row[r] *= c, weighted_row[r] = c * h[j * w + r];
  }
}

void combine_expert_rows(const float* slot_rows, int64_t width, const int32_t* token_slot, const float* slot_weight,
                         int64_t tokens, int64_t k, bool accumulate, float* y) {
  parallel_rows(tokens, k * width, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* out = y + t * width;
      if (!accumulate) std::fill(out, out + width, 0.0f);
      for (int64_t i = 0; i < k; ++i) {
        const int64_t slot = token_slot[t * k + i];
        const float c = slot_weight ? slot_weight[slot] : 1.0f;
        const float* row = slot_rows + slot * width;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) out[j] += c * row[j];
      }
    }
  });
}

void select_experts(const float* scores, const float* bias, int64_t n, int64_t experts, int64_t k, float scaling,
                    int32_t* selected, float* weights) {
  parallel_rows(n, experts, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* s = scores + t * experts;
      int32_t* ids = selected + t * k;
      float* best = weights + t * k;  // the biased values of the current top-k, best first
      int64_t count = 0;
      for (int64_t e = 0; e < experts; ++e) {
        const float v = s[e] + bias[e];
        if (count == k && !(v > best[k - 1])) continue;
        // Strictly greater moves up: an equal value stays behind the lower id already there.
        int64_t i = count < k ? count++ : k - 1;
        for (; i > 0 && v > best[i - 1]; --i) best[i] = best[i - 1], ids[i] = ids[i - 1];
        best[i] = v, ids[i] = int32_t(e);
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) sum += s[ids[i]];
      const float scale = scaling / sum;
      for (int64_t i = 0; i < k; ++i) best[i] = s[ids[i]] * scale;
    }
  });
}

void routing_weights_backward(const float* scores, const int32_t* selected, const float* weights, int64_t n,
                              int64_t experts, int64_t k, float scaling, const float* d_weights, float* d_scores) {
  const int64_t E = experts;
  const float* s = scores;
  const int32_t* ids = selected;
  const float* w = weights;
  parallel_rows(n, E + 2 * k, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* ds = d_scores + t * E;
      std::memset(ds, 0, size_t(E) * sizeof(float));
      // w_i = S s_i / Z  ⇒  dL/ds_j = S/Z · (dL/dw_j − Σ_i dL/dw_i · w_i / S), Z = Σ_top-k s.
      float z = 0.0f, weighted = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        z += s[t * E + ids[t * k + i]];
        weighted += d_weights[t * k + i] * w[t * k + i];
      }
      const float scale = scaling / z, mean = weighted / scaling;
      for (int64_t i = 0; i < k; ++i) ds[ids[t * k + i]] = scale * (d_weights[t * k + i] - mean);
    }
  });
}

}  // namespace hyla
