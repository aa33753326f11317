#include "hyla/model/attn_res.h"

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/kernels/attn_res.h"

namespace hyla {

AttnRes::AttnRes(ParamStore& store, const std::string& query_name, const std::string& norm_name, int64_t dim, float eps)
    : query_(&store.add(query_name, {dim}, Init::Zeros, Component::AttnRes, /*weight_decay=*/false)),
      norm_(&store.add(norm_name + ".weight", {dim}, Init::Ones, Component::AttnRes, /*weight_decay=*/false)),
      dim_(dim),
      eps_(eps) {}

void AttnRes::forward(const std::vector<const float*>& sources, int64_t rows, float* out, bool save,
                      Workspace& workspace) {
  const int64_t n = int64_t(sources.size());
  if (!weights_.defined() || weights_.numel() < rows * n) weights_ = Tensor::empty(DType::F32, {std::max<int64_t>(rows * n, 1)});
  attn_res_forward(sources.data(), n, rows, dim_, query_->v(), norm_->v(), eps_, weights_.data<float>(), out,
                   workspace);
  if (save) sources_ = sources, rows_ = rows;
}

void AttnRes::backward(const float* d_out, const std::vector<float*>& source_grads, Workspace& workspace) {
  HYLA_ASSERT(source_grads.size() == sources_.size());
  attn_res_backward(sources_.data(), int64_t(sources_.size()), rows_, dim_, query_->v(), norm_->v(), eps_,
                    weights_.data<float>(), d_out, source_grads.data(), query_->g(), norm_->g(), workspace);
}

}  // namespace hyla
