#pragma once
// Parameter-holding building blocks shared by the mixers and FFNs: Linear (y = x Wᵀ, W [out, in]
// as SPEC stores weights) and RMSNorm, each with forward and backward.
#include <initializer_list>
#include <string>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/model/context.h"
#include "hyla/model/params.h"

namespace hyla {

// Whether `hyla quantize` may store a Linear's weight as int8 (docs/quantization.md says which
// stay floating point and why).
enum class WeightStorage : uint8_t { Int8Allowed, FloatOnly };

class Linear {
 public:
  Linear() = default;
  Linear(ParamStore& store, const std::string& name, int64_t in_features, int64_t out_features, Component component,
         Init init = Init::Normal, WeightStorage storage = WeightStorage::Int8Allowed);
  // One matrix over parameters registered one after another with the same input width (they are
  // contiguous in the store): e.g. KDA's [q k v f g b] projections as a single GEMM. Marks the
  // parts as fused, so that a model file must store them alike.
  static Linear fuse(std::initializer_list<const Linear*> parts);
  // A Linear over an existing [out, in] parameter (e.g. a tied LM head over the embedding).
  static Linear over(Param& weight);

  bool defined() const { return !parts_.empty(); }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  const Param& param() const { return *parts_[0]; }
  // The whole matrix (every part of a fused one): f32 values, their gradient, the bf16 copy.
  float* w() const { return parts_[0]->v(); }
  float* dw() const { return parts_[0]->g(); }
  const bf16* w16() const { return parts_[0]->v16(); }
  // Stored as int8 (loaded from a `hyla quantize` directory): the forward runs on int8 products
  // under every Precision, and there is no backward.
  bool int8() const { return defined() && parts_[0]->is_int8(); }
  // Stored as MXFP4 (a routed expert's matrix): only RoutedExperts multiplies it.
  bool mxfp4() const { return defined() && parts_[0]->is_mxfp4(); }
  // Stored as ggml blocks in a GGUF's map (Param::ggml): the forward multiplies them where they lie
  // (kernels/ggml_gemm.h) under every Precision, and there is no backward.
  bool ggml() const { return defined() && parts_[0]->is_ggml(); }

  // y[n, out] = x[n, in] Wᵀ + beta·y (rows of x and y ld_x / ld_y apart).
  void forward(const float* x, int64_t n, float* y, Precision p, float beta = 0.0f, int64_t ld_x = -1,
               int64_t ld_y = -1) const;
  // dx[n, in] = dy[n, out] W + beta·dx.
  void backward_input(const float* dy, int64_t n, float* dx, Precision p, float beta = 0.0f, int64_t ld_dy = -1,
                      int64_t ld_dx = -1) const;
  // dW += dyᵀ x.
  void backward_weight(const float* x, const float* dy, int64_t n, Precision p, int64_t ld_x = -1,
                       int64_t ld_dy = -1) const;

 private:
  void check_f32_values() const;  // an error naming a bf16_only matrix
  std::vector<Param*> parts_;  // the matrix's rows, part by part (one part unless fused)
  int64_t in_ = 0, out_ = 0;
};

// RMSNorm_w over rows of width `dim`; the layer keeps 1/rms per row for its backward.
class RmsNorm {
 public:
  RmsNorm() = default;
  RmsNorm(ParamStore& store, const std::string& name, int64_t dim, Component component, float eps);
  bool defined() const { return weight_ != nullptr; }
  int64_t dim() const { return dim_; }
  Param& weight() const { return *weight_; }
  // y = RMSNorm(x); x must stay valid until backward when saving.
  void forward(const float* x, int64_t rows, float* y, bool save, int64_t ld_x = -1, int64_t ld_y = -1);
  // dx (= or += when accumulate) from dy; adds to the weight's gradient.
  void backward(const float* dy, float* dx, bool accumulate, Workspace& workspace, int64_t ld_dy = -1,
                int64_t ld_dx = -1);

 private:
  Param* weight_ = nullptr;
  int64_t dim_ = 0;
  float eps_ = 1e-5f;
  const float* saved_x_ = nullptr;
  int64_t saved_rows_ = 0, saved_ld_ = 0;
  Tensor rstd_;
};

}  // namespace hyla
