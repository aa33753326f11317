#pragma once
// The routed experts of the MoE layer (SPEC §5), E_i(x) = W_down,i act(W_gate,i x, W_up,i x): the
// "expert compute over an expert range" stage of moe_dispatch.h.
//
// Experts are small (configs/small.json: 128 experts of width 128, ~128 tokens each at 4096
// tokens), far too small for a multi-threaded oneDNN call each; threads take blocks of
// ≤ kTokenBlock slots of one expert, largest first, and run single-threaded register-blocked
// products on them (kernels/small_gemm.h). Inside a block the activations are feature-major
// ([features, tokens]), so that the weights, as stored ([out, in]), are the left operand of every
// forward product (GU = W_gu Xᵀ, Yᵀ = W_down H) and no weight is ever transposed; the backward
// transposes only the small H and dH blocks. BENCHMARKS.md "MoE layer" has the alternatives measured.
#include <cstdint>
#include <string>
#include <vector>

#include "hyla/kernels/activations.h"
#include "hyla/model/gated_mlp.h"
#include "hyla/model/moe_dispatch.h"

namespace hyla {

class RoutedExperts {
 public:
  static constexpr int64_t kTokenBlock = 128;

  RoutedExperts() = default;
  // Registers experts.{i}.gate_proj/up_proj/down_proj for i < E, each on inputs `in` wide.
  RoutedExperts(ParamStore& store, const std::string& prefix, const ModelConfig& config, int64_t in);

  // For the experts in [first, last): out slot rows [slots, in] = E_e(x[slot_token[j]]), unweighted.
  // Keeps what backward needs when `save` (x must then stay valid until backward).
  void forward(const float* x, const ExpertDispatch& dispatch, int64_t first, int64_t last, Precision precision,
               bool save, float* out);

  // dm [tokens, in]: dL/d(combined output). For the experts in [first, last): writes the slot rows
  // of d_in [slots, in] (dL/dx of each slot, routing weight applied) and d_weight [slots] (dL/dw of
  // each slot's routing weight), and adds the experts' parameter gradients. x and dispatch as in
  // the saving forward.
  void backward(const float* x, const float* dm, const ExpertDispatch& dispatch, int64_t first, int64_t last,
                float* d_in, float* d_weight);

 private:
  struct Block {
    int64_t expert, begin, size;  // slots [begin, begin + size)
  };
  // One thread's work buffers for a block of ≤ kTokenBlock slots, carved out of scratch_.
  struct BlockBuffers {
    float* rows;      // [block, in]
    float* features;  // [in, block]
    float* gu;        // [2w, block]
    float* h;         // [w, block]
    float* h_rows;    // [block, w]
    float* dh_rows;   // [block, w]
    void* pack;       // small_gemm_bf16's packing space
  };
  // Blocks of the experts in [first, last), largest first; with `whole_experts` one entry per
  // expert (begin/size span all its slots) so that one thread owns each expert's gradients.
  void plan(const ExpertDispatch& dispatch, int64_t first, int64_t last, bool whole_experts);
  BlockBuffers thread_buffers(int thread);

  std::vector<GatedMlp> experts_;
  GatedActivation activation_ = GatedActivation::Swiglu;
  int64_t in_ = 0, width_ = 0;
  Precision saved_precision_ = Precision::F32;
  Tensor saved_gu_;  // [slots · 2w]: per block [2w, block] (feature-major) pre-activations
  Tensor saved_h_;   // [slots · w]: per block [w, block] activations
  std::vector<Block> blocks_;
  Tensor scratch_;   // per thread: the block buffers and the bf16 products' packing space
  int64_t scratch_floats_ = 0;
};

}  // namespace hyla
