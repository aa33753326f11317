#include "hyla/model/layers.h"

#include <memory>
#include <vector>

#include "hyla/core/memory.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/ggml_gemm.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/matmul.h"
#include "hyla/kernels/norm.h"

namespace hyla {
namespace {

// bf16 copies of activations for the matrix products, per thread and slot, grown and reused.
bf16* bf16_rows(int slot, const float* x, int64_t rows, int64_t cols, int64_t ld) {
  thread_local std::shared_ptr<void> buffers[2];
  thread_local size_t capacity[2] = {0, 0};
  const size_t n = size_t(rows * cols);
  if (n > capacity[slot]) {
    buffers[slot] = allocate_aligned(n * sizeof(bf16));
    capacity[slot] = n;
  }
  bf16* out = static_cast<bf16*>(buffers[slot].get());
  copy_heads(x, {ld, 0}, rows, 1, cols, out, {cols, 0});
  return out;
}

// The int8 and ggml-block products' quantised activation rows, per thread, grown and reused.
void* int8_workspace(int64_t bytes) {
  thread_local std::shared_ptr<void> buffer;
  thread_local int64_t capacity = 0;
  if (bytes > capacity) {
    buffer = allocate_aligned(size_t(bytes));
    capacity = bytes;
  }
  return buffer.get();
}

}  // namespace

Linear::Linear(ParamStore& store, const std::string& name, int64_t in_features, int64_t out_features,
               Component component, Init init, WeightStorage storage)
    : parts_{&store.add(name + ".weight", {out_features, in_features}, init, component)},
      in_(in_features),
      out_(out_features) {
  parts_[0]->int8_allowed = storage == WeightStorage::Int8Allowed;
}

Linear Linear::fuse(std::initializer_list<const Linear*> parts) {
  Linear fused;
  for (const Linear* p : parts) {
    HYLA_ASSERT(p->defined());
    if (!fused.defined()) {
      fused = *p;
      continue;
    }
    HYLA_ASSERT(p->in_ == fused.in_);
    fused.parts_.back()->fused_with_next = true;
    fused.parts_.back()->stored_like_next = true;
    fused.parts_.insert(fused.parts_.end(), p->parts_.begin(), p->parts_.end());
    fused.out_ += p->out_;
  }
  return fused;
}

Linear Linear::over(Param& weight) {
  Linear l;
  l.parts_ = {&weight};
  l.out_ = weight.shape[0];
  l.in_ = weight.shape[1];
  return l;
}

void Linear::forward(const float* x, int64_t n, float* y, Precision p, float beta, int64_t ld_x, int64_t ld_y) const {
  ld_x = ld_x < 0 ? in_ : ld_x;
  ld_y = ld_y < 0 ? out_ : ld_y;
  if (int8()) {
    constexpr size_t kMaxParts = 8;
    HYLA_ASSERT(parts_.size() <= kMaxParts);
    Int8PackedMatrix matrices[kMaxParts];
    for (size_t i = 0; i < parts_.size(); ++i) matrices[i] = parts_[i]->int8;
    const int64_t block = matrices[0].block;
    int8_matmul(x, n, ld_x, {matrices, parts_.size()}, y, ld_y, beta, int8_workspace(int8_rows_bytes(n, in_, block)));
  } else if (ggml()) {
    constexpr size_t kMaxParts = 8;
    HYLA_ASSERT(parts_.size() <= kMaxParts);
    GgmlMatrix matrices[kMaxParts];
    for (size_t i = 0; i < parts_.size(); ++i) matrices[i] = parts_[i]->ggml;
    ggml_matmul(x, n, ld_x, {matrices, parts_.size()}, y, ld_y, beta, int8_workspace(ggml_matmul_bytes(n, in_, num_threads())));
  } else if (p == Precision::BF16) {
    const bf16* xb = bf16_rows(0, x, n, in_, ld_x);
    gemm(Trans::N, Trans::T, n, out_, in_, 1.0f, xb, in_, w16(), in_, beta, y, ld_y);
  } else {
    check_f32_values();
    gemm(Trans::N, Trans::T, n, out_, in_, 1.0f, x, ld_x, w(), in_, beta, y, ld_y);
  }
}

void Linear::check_f32_values() const {
  HYLA_CHECK(!parts_[0]->bf16_only, "'{}' is held as bf16 only (the model was loaded for bf16 products): an f32 "
             "product cannot use it", parts_[0]->name);
}

void Linear::backward_input(const float* dy, int64_t n, float* dx, Precision p, float beta, int64_t ld_dy,
                            int64_t ld_dx) const {
  HYLA_ASSERT(!int8() && !ggml());
  ld_dy = ld_dy < 0 ? out_ : ld_dy;
  ld_dx = ld_dx < 0 ? in_ : ld_dx;
  if (p == Precision::BF16) {
    const bf16* dyb = bf16_rows(0, dy, n, out_, ld_dy);
    gemm(Trans::N, Trans::N, n, in_, out_, 1.0f, dyb, out_, w16(), in_, beta, dx, ld_dx);
  } else {
    check_f32_values();
    gemm(Trans::N, Trans::N, n, in_, out_, 1.0f, dy, ld_dy, w(), in_, beta, dx, ld_dx);
  }
}

void Linear::backward_weight(const float* x, const float* dy, int64_t n, Precision p, int64_t ld_x,
                             int64_t ld_dy) const {
  HYLA_ASSERT(!int8() && !ggml());
  ld_x = ld_x < 0 ? in_ : ld_x;
  ld_dy = ld_dy < 0 ? out_ : ld_dy;
  if (p == Precision::BF16) {
    const bf16* dyb = bf16_rows(0, dy, n, out_, ld_dy);
    const bf16* xb = bf16_rows(1, x, n, in_, ld_x);
    gemm(Trans::T, Trans::N, out_, in_, n, 1.0f, dyb, out_, xb, in_, 1.0f, dw(), in_);
  } else {
    gemm(Trans::T, Trans::N, out_, in_, n, 1.0f, dy, ld_dy, x, ld_x, 1.0f, dw(), in_);
  }
}

RmsNorm::RmsNorm(ParamStore& store, const std::string& name, int64_t dim, Component component, float eps)
    : weight_(&store.add(name + ".weight", {dim}, Init::Ones, component, /*weight_decay=*/false)),
      dim_(dim),
      eps_(eps) {}

void RmsNorm::forward(const float* x, int64_t rows, float* y, bool save, int64_t ld_x, int64_t ld_y) {
  ld_x = ld_x < 0 ? dim_ : ld_x;
  ld_y = ld_y < 0 ? dim_ : ld_y;
  float* rstd = nullptr;
  if (save) {
    if (!rstd_.defined() || rstd_.numel() < rows) rstd_ = Tensor::empty(DType::F32, {std::max<int64_t>(rows, 1)});
    rstd = rstd_.data<float>();
    saved_x_ = x, saved_rows_ = rows, saved_ld_ = ld_x;
  }
  rmsnorm_forward(x, ld_x, weight_->v(), rows, dim_, eps_, y, ld_y, rstd);
}

void RmsNorm::backward(const float* dy, float* dx, bool accumulate, Workspace& workspace, int64_t ld_dy,
                       int64_t ld_dx) {
  HYLA_ASSERT(saved_x_ != nullptr);
  rmsnorm_backward(saved_x_, saved_ld_, weight_->v(), rstd_.data<float>(), dy, ld_dy < 0 ? dim_ : ld_dy, saved_rows_,
                   dim_, dx, ld_dx < 0 ? dim_ : ld_dx, accumulate, weight_->g(), workspace);
}

}  // namespace hyla
