#include "hyla/model/moe_experts.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "hyla/kernels/small_gemm.h"
#include "hyla/kernels/vmath.h"
#include "hyla/model/layer_buffer.h"

namespace hyla {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// C = alpha · op(A) · B + beta · C on one thread, with bf16-rounded inputs under Precision::BF16.
struct BlockProduct {
  Precision precision;
  void* pack;  // small_gemm_bf16's packing space
  void operator()(bool trans_a, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float beta, float* C, int64_t ldc) const {
    if (precision == Precision::BF16) small_gemm_bf16(trans_a, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, pack);
    else small_gemm(trans_a, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  }
};

void gather_rows(const float* x, int64_t width, const int32_t* rows, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) std::memcpy(out + j * width, x + int64_t(rows[j]) * width, size_t(width) * sizeof(float));
}

}  // namespace

RoutedExperts::RoutedExperts(ParamStore& store, const std::string& prefix, const ModelConfig& config, int64_t in)
    : activation_(config.moe.activation == Activation::Situ ? GatedActivation::Situ : GatedActivation::Swiglu),
      in_(in),
      width_(config.moe.moe_intermediate_size) {
  experts_.reserve(size_t(config.moe.num_experts));
  for (int64_t e = 0; e < config.moe.num_experts; ++e)
    experts_.emplace_back(store, prefix + "experts." + std::to_string(e) + ".", in, width_, Component::RoutedExperts);
  const int64_t B = kTokenBlock, D = in_, w = width_;
  // The largest packing space among the block products of forward and backward.
  const int64_t pack_bytes = std::max({small_gemm_bf16_scratch(2 * w, B, D), small_gemm_bf16_scratch(D, B, w),
                                       small_gemm_bf16_scratch(B, w, D), small_gemm_bf16_scratch(B, D, 2 * w),
                                       small_gemm_bf16_scratch(2 * w, D, B), small_gemm_bf16_scratch(D, w, B)});
  scratch_floats_ = round_up(2 * B * D, 16) + round_up(2 * w * B, 16) + 3 * round_up(w * B, 16) +
                    round_up((pack_bytes + 3) / 4, 16);
}

RoutedExperts::BlockBuffers RoutedExperts::thread_buffers(int thread) {
  const int64_t B = kTokenBlock, D = in_, w = width_;
  float* p = scratch_.data<float>() + thread * scratch_floats_;
  auto take = [&p](int64_t floats) {
    float* start = p;
    p += round_up(floats, 16);  // keeps every buffer 64-byte aligned
    return start;
  };
  BlockBuffers b;
  b.rows = take(B * D);
  b.features = take(B * D);
  b.gu = take(2 * w * B);
  b.h = take(w * B);
  b.h_rows = take(B * w);
  b.dh_rows = take(B * w);
  b.pack = p;
  return b;
}

void RoutedExperts::plan(const ExpertDispatch& dispatch, int64_t first, int64_t last, bool whole_experts) {
  blocks_.clear();
  for (int64_t e = first; e < last; ++e) {
    const int64_t begin = dispatch.offsets[size_t(e)], slots = dispatch.load[size_t(e)];
    if (slots == 0) continue;
    if (whole_experts) {
      blocks_.push_back({e, begin, slots});
      continue;
    }
    const int64_t parts = (slots + kTokenBlock - 1) / kTokenBlock;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t lo = slots * p / parts, hi = slots * (p + 1) / parts;
      blocks_.push_back({e, begin + lo, hi - lo});
    }
  }
  std::stable_sort(blocks_.begin(), blocks_.end(), [](const Block& a, const Block& b) { return a.size > b.size; });
}

void RoutedExperts::forward(const float* x, const ExpertDispatch& dispatch, int64_t first, int64_t last,
                            Precision precision, bool save, float* out) {
  const int64_t D = in_, w = width_, slots = dispatch.tokens * dispatch.k;
  if (save) {
    grow_buffer<float>(saved_gu_, slots * 2 * w);
    grow_buffer<float>(saved_h_, slots * w);
    saved_precision_ = precision;
  }
  grow_buffer<float>(scratch_, omp_get_max_threads() * scratch_floats_);
  plan(dispatch, first, last, /*whole_experts=*/false);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block blk = blocks_[i];
    const int64_t n = blk.size;
    const BlockBuffers buf = thread_buffers(omp_get_thread_num());
    const BlockProduct mm{precision, buf.pack};
    const GatedMlp& expert = experts_[size_t(blk.expert)];
    float* gu = save ? saved_gu_.data<float>() + blk.begin * 2 * w : buf.gu;
    float* h = save ? saved_h_.data<float>() + blk.begin * w : buf.h;
    gather_rows(x, D, dispatch.slot_token.data() + blk.begin, n, buf.rows);
    transpose(buf.rows, n, D, D, buf.features, n);
    mm(false, 2 * w, n, D, expert.gate_proj.w(), D, buf.features, n, 0.0f, gu, n);  // [gate; up] Xᵀ
    gated_activation_forward(activation_, gu, 1, w * n, h);
    mm(false, D, n, w, expert.down_proj.w(), w, h, n, 0.0f, buf.features, n);  // Yᵀ = W_down H
    transpose(buf.features, D, n, n, out + blk.begin * D, D);
  }
}

void RoutedExperts::backward(const float* x, const float* dm, const ExpertDispatch& dispatch, int64_t first,
                             int64_t last, float* d_in, float* d_weight) {
  const int64_t D = in_, w = width_;
  grow_buffer<float>(scratch_, omp_get_max_threads() * scratch_floats_);
  plan(dispatch, first, last, /*whole_experts=*/true);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block whole = blocks_[i];
    const BlockBuffers buf = thread_buffers(omp_get_thread_num());
    const BlockProduct mm{saved_precision_, buf.pack};
    const GatedMlp& expert = experts_[size_t(whole.expert)];
    const float* w_gu = expert.gate_proj.w();
    const float* w_down = expert.down_proj.w();
    // The forward's blocks of this expert, in the same partition.
    const int64_t parts = (whole.size + kTokenBlock - 1) / kTokenBlock;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t lo = whole.size * p / parts, begin = whole.begin + lo, n = whole.size * (p + 1) / parts - lo;
      const int32_t* tokens = dispatch.slot_token.data() + begin;
      const float* routing_weight = dispatch.slot_weight.data() + begin;
      const float* gu = saved_gu_.data<float>() + begin * 2 * w;
      const float* h = saved_h_.data<float>() + begin * w;
      float* g = buf.rows;  // [n, D] dL/dy of the slots' tokens, unweighted
      gather_rows(dm, D, tokens, n, g);
      mm(false, n, w, D, g, D, w_down, w, 0.0f, buf.dh_rows, w);  // dL/dh before the routing weight
      transpose(h, w, n, n, buf.h_rows, w);
      for (int64_t j = 0; j < n; ++j) {
        // y_slot = c · E(x)  ⇒  dL/dc = dL/dy · E(x) = (dL/dy W_down) · h.
        float* dh_row = buf.dh_rows + j * w;
        float* h_row = buf.h_rows + j * w;
        d_weight[begin + j] = dot(dh_row, h_row, w);
        const float c = routing_weight[j];
        for (int64_t r = 0; r < w; ++r) dh_row[r] *= c, h_row[r] *= c;
      }
      transpose(buf.dh_rows, n, w, w, buf.h, n);  // dHᵀ [w, n]
      gated_activation_backward(activation_, gu, buf.h, 1, w * n, buf.gu);  // dGUᵀ [2w, n]
      mm(true, n, D, 2 * w, buf.gu, n, w_gu, D, 0.0f, d_in + begin * D, D);  // dX = dGU W_gu
      float* rows = buf.features;  // [n, D] the slots' inputs
      gather_rows(x, D, tokens, n, rows);
      mm(false, 2 * w, D, n, buf.gu, n, rows, D, 1.0f, expert.gate_proj.dw(), D);  // dW_gu += dGUᵀ X
      mm(true, D, w, n, g, D, buf.h_rows, w, 1.0f, expert.down_proj.dw(), w);      // dW_down += Gᵀ (c ⊙ H)
    }
  }
}

}  // namespace hyla
