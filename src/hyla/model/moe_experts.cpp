#include "hyla/model/moe_experts.h"

#include <algorithm>
#include <cstring>

#include "hyla/core/arith.h"
#include "hyla/core/team.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/moe.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/kernels/skinny_gemm.h"
#include "hyla/kernels/small_gemm.h"

namespace hyla {
namespace {

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

// Quantised rows of `cols` values for the int8 products at any block the format allows (the
// smallest needs the most), the MXFP4 products or the ggml-block products.
int64_t int8_workspace_floats(int64_t rows, int64_t cols) {
  return (std::max({int8_rows_bytes(rows, cols, 16), mxfp4_q8_rows_bytes(rows, cols), ggml_matmul_bytes(rows, cols)}) + 3) / 4;
}

}  // namespace

RoutedExperts::RoutedExperts(ParamStore& store, const std::string& prefix, const ModelConfig& config, int64_t in)
    : activation_(gated_activation(config.moe.activation, config.moe, config.moe.swiglu_limit)),
      in_(in),
      width_(config.moe.moe_intermediate_size) {
  experts_.reserve(size_t(config.moe.num_experts));
  for (int64_t e = 0; e < config.moe.num_experts; ++e)
    experts_.emplace_back(store, prefix + "experts." + std::to_string(e) + ".", in, width_, Component::RoutedExperts);
  const int64_t B = kTokenBlock, D = in_, w = width_;
  // The largest packing space among the bf16 block products that pack their operands.
  pack_bytes_ = std::max({small_gemm_bf16_scratch(B, 2 * w, D), small_gemm_bf16_scratch(B, D, w),
                          small_gemm_bf16_scratch(B, w, D), small_gemm_bf16_scratch(B, D, 2 * w),
                          small_gemm_bf16_scratch(2 * w, D, B), small_gemm_bf16_scratch(D, w, B)});
}

RoutedExperts::BlockBuffers RoutedExperts::block_buffers(Frame& frame) const {
  const int64_t B = kTokenBlock, D = in_, w = width_;
  BlockBuffers b;
  b.rows = frame.take<float>(B * D);
  b.grad_rows = frame.take<float>(B * D);
  b.gu = frame.take<float>(B * 2 * w);
  b.h = frame.take<float>(B * w);
  b.h_other = frame.take<float>(B * w);
  b.weights_t = frame.take<float>(std::max(D * round_up(2 * w, 16), w * round_up(D, 16)));
  b.int8_rows = frame.take<float>(int8_workspace_floats(B, std::max(D, w)));
  b.pack = frame.take<char>(pack_bytes_);
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
    const int64_t parts = ceil_div(slots, kTokenBlock);
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t lo = slots * p / parts, hi = slots * (p + 1) / parts;
      blocks_.push_back({e, begin + lo, hi - lo});
    }
  }
  // Largest first, ties in the order built (std::sort with the tie broken by position: a stable
  // sort would take a buffer from the heap on every forward).
  std::sort(blocks_.begin(), blocks_.end(), [](const Block& a, const Block& b) {
    return a.size != b.size ? a.size > b.size : a.begin < b.begin;
  });
}

void RoutedExperts::forward(const float* x, const ExpertDispatch& dispatch, int64_t first, int64_t last,
                            Precision precision, ExpertActivations saved, float* out, Workspace& workspace,
                            std::span<const PackedExpertWeights> packed) {
  const int64_t D = in_, w = width_;
  plan(dispatch, first, last, /*whole_experts=*/false);
  workspace.reserve();
  Frame frame(workspace.serial());
  // bf16: input rows converted once, then gathered as the kernel's packed left operand; the
  // weights' bf16 copies, transposed as 32-bit words, are its packed right operand. (Odd widths
  // have no bf16 pairs along the reduced dimension: those take the packing products.)
  const bool all_quantized = std::all_of(experts_.begin() + first, experts_.begin() + last,
                                         [](const GatedMlp& e) { return e.gate_up.param().is_quantized(); });
  const bool packed_bf16 = precision == Precision::BF16 && D % 2 == 0 && w % 2 == 0 && !all_quantized;
  const bf16* x16 = nullptr;
  if (packed_bf16) {
    bf16* converted = frame.take<bf16>(dispatch.tokens * D);
    copy_heads(x, {D, 0}, dispatch.tokens, 1, D, converted, {D, 0});
    x16 = converted;
  }
  parallel_for(int64_t(blocks_.size()), 1, [&](int thread, int64_t first_block, int64_t last_block) {
  Frame thread_frame(workspace.thread(thread));
  const BlockBuffers buf = block_buffers(thread_frame);
  for (int64_t i = first_block; i < last_block; ++i) {
    const Block blk = blocks_[size_t(i)];
    const int64_t n = blk.size;
    const GatedMlp& expert = experts_[size_t(blk.expert)];
    const int32_t* tokens = dispatch.slot_token.data() + blk.begin;
    float* gu = saved.gu ? saved.gu + blk.begin * 2 * w : buf.gu;
    float* h = saved.h ? saved.h + blk.begin * w : buf.h;
    float* y = out + blk.begin * D;
    if (!packed.empty() || expert.gate_up.param().is_quantized()) {
      gather_rows(x, D, tokens, n, buf.rows);
      const Param &gate = expert.gate_proj.param(), &up = expert.up_proj.param(), &down = expert.down_proj.param();
      const PackedExpertWeights weights =
          !packed.empty()  ? packed[size_t(blk.expert)]
          : gate.is_int8() ? PackedExpertWeights(Int8ExpertWeights{gate.int8, up.int8, down.int8})
          : gate.is_ggml() ? PackedExpertWeights(GgmlExpertWeights{gate.ggml, up.ggml, down.ggml})
                           : PackedExpertWeights(Mxfp4ExpertWeights{gate.mxfp4, up.mxfp4, down.mxfp4});
      if (const auto* int8 = std::get_if<Int8ExpertWeights>(&weights))
        forward_int8(*int8, buf.rows, n, gu, h, y, buf.int8_rows);
      else if (const auto* blocks = std::get_if<GgmlExpertWeights>(&weights))
        forward_ggml(*blocks, buf.rows, n, gu, h, y, buf.int8_rows);
      else
        forward_mxfp4(std::get<Mxfp4ExpertWeights>(weights), buf.rows, n, gu, h, y, precision, buf.int8_rows);
    } else if (n <= kSkinnyMaxRows && (packed_bf16 || precision == Precision::F32)) {
      // Decode-sized blocks: the expert's weights are read once, in their stored layout.
      if (packed_bf16) {
        bf16* rows = reinterpret_cast<bf16*>(buf.rows);
        for (int64_t j = 0; j < n; ++j) std::memcpy(rows + j * D, x16 + int64_t(tokens[j]) * D, size_t(D) * sizeof(bf16));
        skinny_gemm(n, 2 * w, D, 1.0f, rows, D, expert.gate_up.w16(), D, 0.0f, gu, 2 * w);
        gated_activation_forward(activation_, gu, n, w, h);
        bf16* h16 = reinterpret_cast<bf16*>(buf.h_other);
        convert(h, h16, size_t(n * w));
        skinny_gemm(n, D, w, 1.0f, h16, w, expert.down_proj.param().v16(), w, 0.0f, y, D);
      } else {
        gather_rows(x, D, tokens, n, buf.rows);
        skinny_gemm(n, 2 * w, D, 1.0f, buf.rows, D, expert.gate_up.w(), D, 0.0f, gu, 2 * w);
        gated_activation_forward(activation_, gu, n, w, h);
        skinny_gemm(n, D, w, 1.0f, h, w, expert.down_proj.w(), w, 0.0f, y, D);
      }
    } else if (packed_bf16) {
      // Word p of bf16 row c of W [c, k] is the pair (Wᵀ[2p][c], Wᵀ[2p+1][c]).
      const auto word_transpose = [&](const bf16* weights, int64_t rows, int64_t cols, int64_t ld_pairs) {
        transpose(reinterpret_cast<const float*>(weights), rows, cols / 2, cols / 2, buf.weights_t, ld_pairs);
        return reinterpret_cast<const uint32_t*>(buf.weights_t);
      };
      bf16* rows = reinterpret_cast<bf16*>(buf.rows);
      for (int64_t j = 0; j < n; ++j) std::memcpy(rows + j * D, x16 + int64_t(tokens[j]) * D, size_t(D) * sizeof(bf16));
      const int64_t ld_gu = round_up(2 * w, 16), ld_down = round_up(D, 16);
      small_gemm_bf16_packed(n, 2 * w, D, 1.0f, rows, D, word_transpose(expert.gate_up.w16(), 2 * w, D, ld_gu),
                             ld_gu, 0.0f, gu, 2 * w);
      gated_activation_forward(activation_, gu, n, w, h);
      bf16* h16 = reinterpret_cast<bf16*>(buf.h_other);
      convert(h, h16, size_t(n * w));
      small_gemm_bf16_packed(n, D, w, 1.0f, h16, w, word_transpose(expert.down_proj.param().v16(), D, w, ld_down),
                             ld_down, 0.0f, y, D);
    } else {
      const BlockProduct mm{precision, buf.pack};
      gather_rows(x, D, tokens, n, buf.rows);
      transpose(expert.gate_up.w(), 2 * w, D, D, buf.weights_t, 2 * w);
      mm(false, n, 2 * w, D, buf.rows, D, buf.weights_t, 2 * w, 0.0f, gu, 2 * w);  // X [W_gate; W_up]ᵀ
      gated_activation_forward(activation_, gu, n, w, h);
      transpose(expert.down_proj.w(), D, w, w, buf.weights_t, D);
      mm(false, n, D, w, h, w, buf.weights_t, D, 0.0f, y, D);  // H W_downᵀ
    }
  }
  });
}

void RoutedExperts::forward_int8(const Int8ExpertWeights& expert, const float* rows, int64_t n, float* gu, float* h,
                                 float* y, void* workspace) const {
  const int64_t D = in_, w = width_;
  const Int8PackedMatrix gate_up[2] = {expert.gate, expert.up};
  const Int8PackedMatrix& down = expert.down;
  const Int8Rows x = int8_rows_view(workspace, n, D, gate_up[0].block);
  quantize_int8_rows(rows, D, x, 0, n);
  int8_matmul_rows(x, gate_up, gu, 2 * w, 0.0f);  // X [W_gate; W_up]ᵀ
  gated_activation_forward(activation_, gu, n, w, h);
  const Int8Rows hq = int8_rows_view(workspace, n, w, down.block);
  quantize_int8_rows(h, w, hq, 0, n);
  int8_matmul_rows(hq, {&down, 1}, y, D, 0.0f);  // H W_downᵀ
}

void RoutedExperts::forward_ggml(const GgmlExpertWeights& expert, const float* rows, int64_t n, float* gu, float* h,
                                 float* y, void* workspace) const {
  const int64_t D = in_, w = width_;
  const GgmlMatrix gate_up[2] = {expert.gate, expert.up};
  ggml_matmul_rows(rows, n, D, gate_up, gu, 2 * w, 0.0f, workspace);  // X [W_gate; W_up]ᵀ
  gated_activation_forward(activation_, gu, n, w, h);
  ggml_matmul_rows(h, n, w, {&expert.down, 1}, y, D, 0.0f, workspace);  // H W_downᵀ
}

void RoutedExperts::forward_mxfp4(const Mxfp4ExpertWeights& expert, const float* rows, int64_t n, float* gu, float* h,
                                  float* y, Precision precision, void* workspace) const {
  const int64_t D = in_, w = width_;
  const Mxfp4PackedMatrix gate_up[2] = {expert.gate, expert.up};
  // f32 keeps the activations exact; the bf16 forward rounds them to 8 bits per 32 and multiplies
  // on integer dot products where hyla has them (mxfp4_gemm.h), the f32 product elsewhere.
  if (precision == Precision::F32 || !mxfp4_q8_native()) {
    mxfp4_matmul_rows(rows, n, D, gate_up, gu, 2 * w, 0.0f);  // X [W_gate; W_up]ᵀ
    gated_activation_forward(activation_, gu, n, w, h);
    mxfp4_matmul_rows(h, n, w, {&expert.down, 1}, y, D, 0.0f);  // H W_downᵀ
    return;
  }
  mxfp4_matmul_rows_q8(rows, n, D, gate_up, gu, 2 * w, 0.0f, workspace);
  gated_activation_forward(activation_, gu, n, w, h);
  mxfp4_matmul_rows_q8(h, n, w, {&expert.down, 1}, y, D, 0.0f, workspace);
}

void RoutedExperts::backward(const float* x, const float* dm, const ExpertDispatch& dispatch, int64_t first,
                             int64_t last, ExpertActivations saved, Precision precision, float* d_in, float* d_weight,
                             Workspace& workspace) {
  const int64_t D = in_, w = width_;
  plan(dispatch, first, last, /*whole_experts=*/true);
  workspace.reserve();
  parallel_for(int64_t(blocks_.size()), 1, [&](int thread, int64_t first_block, int64_t last_block) {
  Frame thread_frame(workspace.thread(thread));
  const BlockBuffers buf = block_buffers(thread_frame);
  const BlockProduct mm{precision, buf.pack};
  for (int64_t i = first_block; i < last_block; ++i) {
    const Block whole = blocks_[size_t(i)];
    const GatedMlp& expert = experts_[size_t(whole.expert)];
    const int64_t parts = ceil_div(whole.size, kTokenBlock);
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t lo = whole.size * p / parts, begin = whole.begin + lo, n = whole.size * (p + 1) / parts - lo;
      const int32_t* tokens = dispatch.slot_token.data() + begin;
      const float* routing_weight = dispatch.slot_weight.data() + begin;
      const float* h = saved.h + begin * w;
      float* g = buf.grad_rows;  // dL/dy of the slots' tokens, before the routing weight
      gather_rows(dm, D, tokens, n, g);
      mm(false, n, w, D, g, D, expert.down_proj.w(), w, 0.0f, buf.h, w);  // G W_down
      // y = c · E(x)  ⇒  dL/dc = dL/dy · E(x) = (dL/dy W_down) · h.
      routed_output_backward(h, routing_weight, n, w, buf.h, buf.h_other, d_weight + begin);
      gated_activation_backward(activation_, saved.gu + begin * 2 * w, buf.h, n, w, buf.gu);
      mm(false, n, D, 2 * w, buf.gu, 2 * w, expert.gate_up.w(), D, 0.0f, d_in + begin * D, D);  // dGU W_gu
      gather_rows(x, D, tokens, n, buf.rows);
      mm(true, 2 * w, D, n, buf.gu, 2 * w, buf.rows, D, 1.0f, expert.gate_up.dw(), D);        // += dGUᵀ X
      mm(true, D, w, n, g, D, buf.h_other, w, 1.0f, expert.down_proj.dw(), w);                  // += Gᵀ (c ⊙ H)
    }
  }
  });
}

}  // namespace hyla
