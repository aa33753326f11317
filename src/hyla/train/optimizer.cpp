#include "hyla/train/optimizer.h"

#include <cmath>
#include <cstring>

#include "hyla/core/error.h"
#include "hyla/io/safetensors.h"

namespace hyla {

AdamW::AdamW(ParamStore& params, const TrainConfig& c)
    : params_(params), beta1_(c.beta1), beta2_(c.beta2), eps_(c.eps), weight_decay_(c.weight_decay) {
  HYLA_ASSERT(params.allocated());
  constexpr int64_t kChunk = int64_t(1) << 16;
  int64_t total = 0;
  for (const auto& p : params.params()) {
    if (!p->held) continue;
    const int64_t offset = p->v() - params.values();
    total = std::max(total, offset + p->numel());
    if (!p->trainable) continue;
    for (int64_t i = 0; i < p->numel(); i += kChunk)
      ranges_.push_back({offset + i, std::min(kChunk, p->numel() - i), p->weight_decay});
  }
  m_ = Tensor::zeros(DType::F32, {std::max<int64_t>(total, 1)});
  v_ = Tensor::zeros(DType::F32, {std::max<int64_t>(total, 1)});
}

double AdamW::grad_norm() const {
  const float* g = params_.grads();
  double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (size_t r = 0; r < ranges_.size(); ++r) {
    double s = 0;
    for (int64_t i = ranges_[r].offset; i < ranges_[r].offset + ranges_[r].count; ++i) s += double(g[i]) * g[i];
    sum += s;
  }
  return std::sqrt(sum);
}

void AdamW::step(double lr, float grad_scale) {
  ++steps_;
  const double bias1 = 1.0 - std::pow(beta1_, double(steps_)), bias2 = 1.0 - std::pow(beta2_, double(steps_));
  const float b1 = float(beta1_), b2 = float(beta2_), eps = float(eps_);
  const float step_size = float(lr / bias1), inv_sqrt_bias2 = float(1.0 / std::sqrt(bias2));
  float* w = params_.values();
  const float* g = params_.grads();
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  bf16* w16 = params_.values_bf16();
#pragma omp parallel for schedule(dynamic, 4)
  for (size_t r = 0; r < ranges_.size(); ++r) {
    const Range& range = ranges_[r];
    const float decay = range.decay ? float(1.0 - lr * weight_decay_) : 1.0f;
    const int64_t end = range.offset + range.count;
#pragma omp simd
    for (int64_t i = range.offset; i < end; ++i) {
      const float grad = g[i] * grad_scale;
      m[i] = b1 * m[i] + (1.0f - b1) * grad;
      v[i] = b2 * v[i] + (1.0f - b2) * grad * grad;
      w[i] = w[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bias2 + eps);
    }
    convert(w + range.offset, w16 + range.offset, size_t(range.count));
  }
}

void AdamW::save(const std::filesystem::path& path) const {
  Tensor step = Tensor::empty(DType::I64, {1});
  step.data<int64_t>()[0] = steps_;
  save_safetensors(path, {{"adam.m", m_}, {"adam.v", v_}, {"adam.step", step}});
}

void AdamW::load(const std::filesystem::path& path) {
  const SafetensorsFile file(path);
  for (const char* name : {"adam.m", "adam.v"}) {
    const SafetensorsEntry* e = file.find(name);
    HYLA_CHECK(e && e->dtype == DType::F32 && e->shape.numel() == m_.numel(),
               "{}: '{}' is missing or does not match this model ({} parameters)", path.string(), name, m_.numel());
  }
  std::memcpy(m_.raw(), file.get("adam.m").raw(), m_.nbytes());
  std::memcpy(v_.raw(), file.get("adam.v").raw(), v_.nbytes());
  const SafetensorsEntry* s = file.find("adam.step");
  HYLA_CHECK(s && s->dtype == DType::I64, "{}: missing 'adam.step'", path.string());
  steps_ = file.get("adam.step").data<int64_t>()[0];
}

}  // namespace hyla
