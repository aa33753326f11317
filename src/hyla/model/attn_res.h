#pragma once
// Block Attention Residuals (SPEC §6): a sublayer's input is a softmax mixture over depth,
//   AR(sources; w, γ) = Σ_n softmax_n(w · RMSNorm_γ(V_n)) · V_n   (no 1/√d scale),
// per token, over the completed blocks' outputs and the current block's partial sum.
#include <string>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/core/workspace.h"
#include "hyla/model/params.h"

namespace hyla {

class AttnRes {
 public:
  AttnRes() = default;
  AttnRes(ParamStore& store, const std::string& query_name, const std::string& norm_name, int64_t dim, float eps);
  bool defined() const { return query_ != nullptr; }

  // out[r] = AR over sources[n][r] for `rows` rows of width dim (kernels/attn_res.h). With save,
  // keeps the source pointers (which must stay valid) and the weights for the backward.
  void forward(const std::vector<const float*>& sources, int64_t rows, float* out, bool save, Workspace& workspace);
  // Adds dL/dV_n into source_grads[n] (same order as the forward's sources) and the gradients
  // of w and γ into their parameters.
  void backward(const float* d_out, const std::vector<float*>& source_grads, Workspace& workspace);

 private:
  Param* query_ = nullptr;  // w [d], initialised to 0
  Param* norm_ = nullptr;   // γ [d]
  int64_t dim_ = 0;
  float eps_ = 1e-5f;
  std::vector<const float*> sources_;
  int64_t rows_ = 0;
  Tensor weights_;  // [rows, sources] softmax weights
};

}  // namespace hyla
