#pragma once
// The routed experts of the MoE layer (SPEC §5), E_i(x) = W_down,i act(W_gate,i x, W_up,i x): the
// "expert compute over an expert range" stage of moe_dispatch.h.
//
// Experts are small (configs/small.json: 128 experts of width 128, ~128 tokens each at 4096
// tokens): too small for a multi-threaded oneDNN call each, and a per-expert oneDNN primitive
// would be created for every distinct token count. Instead threads take blocks of ≤ kTokenBlock
// slots of one expert, largest first, and run single-threaded register-blocked products on them
// (kernels/small_gemm.h), tokens as rows. The forward transposes the expert's weights into the
// kernel's right-operand layout per block (for bf16, 32-bit word transposes of the bf16 copies);
// the backward uses them as stored. BENCHMARKS.md "MoE layer" has the alternatives measured.
// Experts loaded as int8, MXFP4 or ggml blocks run the single-threaded int8, MXFP4 or block products
// (kernels/int8_gemm.h, kernels/mxfp4_gemm.h, kernels/ggml_gemm.h) on their packed weights instead, whatever the
// precision (under F32 the MXFP4 products keep the activations f32, so the f32 path uses the
// weights exactly; under BF16 they round them to 8 bits per 32, as int8 products do).
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "hyla/kernels/activations.h"
#include "hyla/kernels/ggml_gemm.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/model/gated_mlp.h"
#include "hyla/core/workspace.h"
#include "hyla/model/moe_dispatch.h"

namespace hyla {

// The experts' pre-activations [slots, 2w] and activations [slots, w] a saving forward keeps
// for the backward (the MoE layer's activations); null when not saving.
struct ExpertActivations {
  float* gu = nullptr;
  float* h = nullptr;
};

// An int8 expert's packed weights (int8_gemm.h): W_gate and W_up, the two parts of one product, and W_down.
struct Int8ExpertWeights {
  Int8PackedMatrix gate, up, down;
};
// An MXFP4 expert's packed weights (mxfp4_gemm.h), the same three matrices.
struct Mxfp4ExpertWeights {
  Mxfp4PackedMatrix gate, up, down;
};
// A ggml-block expert's weights (ggml_gemm.h), the same three matrices, where the file's map holds them.
struct GgmlExpertWeights {
  GgmlMatrix gate, up, down;
};
// A quantised expert's packed weights, in the format the model's files store its experts.
using PackedExpertWeights = std::variant<Int8ExpertWeights, Mxfp4ExpertWeights, GgmlExpertWeights>;

class RoutedExperts {
 public:
  static constexpr int64_t kTokenBlock = 256;

  RoutedExperts() = default;
  // Registers experts.{i}.gate_proj/up_proj/down_proj for i < E, each on inputs `in` wide.
  RoutedExperts(ParamStore& store, const std::string& prefix, const ModelConfig& config, int64_t in);

  int64_t experts() const { return int64_t(experts_.size()); }
  int64_t in() const { return in_; }
  int64_t width() const { return width_; }
  const GatedMlp& expert(int64_t e) const { return experts_[size_t(e)]; }

  // For the experts in [first, last): out slot rows [slots, in] = E_e(x[slot_token[j]]), unweighted.
  // Writes the slots' rows of `saved` when given (x must then stay valid until backward).
  // Quantised experts read their packed weights from `packed` (indexed by expert id) when given,
  // else from their parameters (the offloaded experts of expert_offload.h have none).
  void forward(const float* x, const ExpertDispatch& dispatch, int64_t first, int64_t last, Precision precision,
               ExpertActivations saved, float* out, Workspace& workspace,
               std::span<const PackedExpertWeights> packed = {});

  // dm [tokens, in]: dL/d(combined output). For the experts in [first, last): writes the slot rows
  // of d_in [slots, in] (dL/dx of each slot, routing weight applied) and d_weight [slots] (dL/dw of
  // each slot's routing weight), and adds the experts' parameter gradients. x and dispatch as in
  // the saving forward, whose `saved` activations and precision these are.
  void backward(const float* x, const float* dm, const ExpertDispatch& dispatch, int64_t first, int64_t last,
                ExpertActivations saved, Precision precision, float* d_in, float* d_weight, Workspace& workspace);

 private:
  struct Block {
    int64_t expert, begin, size;  // slots [begin, begin + size)
  };
  // One thread's work buffers for a block of ≤ kTokenBlock slots.
  struct BlockBuffers {
    float* rows;       // [block, in] the slots' inputs (bf16 rows in the bf16 forward)
    float* grad_rows;  // [block, in] dL/dy of the slots' tokens
    float* gu;         // [block, 2w] pre-activations (forward without saving), their gradient (backward)
    float* h;          // [block, w] activations (forward without saving), their gradient (backward)
    float* h_other;    // [block, w] bf16 activation rows (bf16 forward), weighted activations (backward)
    float* weights_t;  // a transposed weight matrix: [in, 2w] or [w, in] (f32 or bf16 pairs)
    void* int8_rows;   // int8 experts: the block's quantised rows (int8_rows_view)
    void* pack;        // small_gemm_bf16's packing space
  };
  // Blocks of the experts in [first, last), largest first; with `whole_experts` one entry per
  // expert (begin/size span all its slots), so that one thread owns each expert's gradients.
  void plan(const ExpertDispatch& dispatch, int64_t first, int64_t last, bool whole_experts);
  BlockBuffers block_buffers(Frame& frame) const;
  // A quantised expert's forward on one block of n slots: rows [n, in] (f32) → gu, h → y [n, in].
  void forward_int8(const Int8ExpertWeights& expert, const float* rows, int64_t n, float* gu, float* h, float* y,
                    void* workspace) const;
  void forward_mxfp4(const Mxfp4ExpertWeights& expert, const float* rows, int64_t n, float* gu, float* h, float* y,
                     Precision precision, void* workspace) const;
  void forward_ggml(const GgmlExpertWeights& expert, const float* rows, int64_t n, float* gu, float* h, float* y,
                    void* workspace) const;

  std::vector<GatedMlp> experts_;
  GatedActivation activation_;
  int64_t in_ = 0, width_ = 0;
  int64_t pack_bytes_ = 0;  // the bf16 products' packing space per thread
  std::vector<Block> blocks_;
};

}  // namespace hyla
