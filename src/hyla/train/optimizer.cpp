#include "hyla/train/optimizer.h"

#include <cmath>
#include <cstring>

#include "hyla/core/error.h"
#include "hyla/io/safetensors.h"

namespace hyla {

AdamW::AdamW(ParamStore& params, const TrainConfig& c) : AdamW(params, c, FlatRange{0, params.numel()}) {}

AdamW::AdamW(ParamStore& params, const TrainConfig& c, FlatRange shard)
    : params_(params), shard_(shard), beta1_(c.beta1), beta2_(c.beta2), eps_(c.eps), weight_decay_(c.weight_decay) {
  HYLA_ASSERT(params.allocated() && shard.first >= 0 && shard.end() <= params.numel());
  constexpr int64_t kChunk = int64_t(1) << 16;
  for (const auto& p : params.params()) {
    if (!p->held || !p->trainable) continue;
    const int64_t offset = p->v() - params.values();
    const int64_t first = std::max(offset, shard.first), end = std::min(offset + p->numel(), shard.end());
    for (int64_t i = first; i < end; i += kChunk) ranges_.push_back({i, std::min(kChunk, end - i), p->weight_decay});
  }
  m_ = Tensor::zeros(DType::F32, {std::max<int64_t>(shard.count, 1)});
  v_ = Tensor::zeros(DType::F32, {std::max<int64_t>(shard.count, 1)});
  if (shard.first == 0 && shard.count == params.numel()) {
    shard_grads_ = params.grads();
  } else {
    own_grads_ = Tensor::zeros(DType::F32, {std::max<int64_t>(shard.count, 1)});
    shard_grads_ = own_grads_.data<float>();
  }
}

double AdamW::grad_square_sum() const {
  const float* g = shard_grads_ - shard_.first;  // indexed by flat offset
  double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (size_t r = 0; r < ranges_.size(); ++r) {
    double s = 0;
    for (int64_t i = ranges_[r].offset; i < ranges_[r].offset + ranges_[r].count; ++i) s += double(g[i]) * g[i];
    sum += s;
  }
  return sum;
}

void AdamW::step(double lr, float grad_scale) {
  ++steps_;
  const double bias1 = 1.0 - std::pow(beta1_, double(steps_)), bias2 = 1.0 - std::pow(beta2_, double(steps_));
  const float b1 = float(beta1_), b2 = float(beta2_), eps = float(eps_);
  const float step_size = float(lr / bias1), inv_sqrt_bias2 = float(1.0 / std::sqrt(bias2));
  float* w = params_.values();
  bf16* w16 = params_.values_bf16();
  // The shard's buffers, indexed by flat offset like the weights.
  const float* g = shard_grads_ - shard_.first;
  float* m = m_.data<float>() - shard_.first;
  float* v = v_.data<float>() - shard_.first;
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
  Tensor step = Tensor::empty(DType::I64, {1}), first = Tensor::empty(DType::I64, {1});
  step.data<int64_t>()[0] = steps_;
  first.data<int64_t>()[0] = shard_.first;
  const Tensor m = m_.rows(0, shard_.count), v = v_.rows(0, shard_.count);
  save_safetensors(path, {{"adam.m", m}, {"adam.v", v}, {"adam.step", step}, {"adam.first", first}});
}

void AdamW::load(const std::vector<std::filesystem::path>& paths) {
  int64_t covered = 0;
  for (const auto& path : paths) {
    const SafetensorsFile file(path);
    const SafetensorsEntry* s = file.find("adam.step");
    const SafetensorsEntry* f = file.find("adam.first");
    HYLA_CHECK(s && s->dtype == DType::I64 && f && f->dtype == DType::I64, "{}: missing 'adam.step' or 'adam.first'",
               path.string());
    const int64_t first = file.get("adam.first").data<int64_t>()[0];
    const SafetensorsEntry* m = file.find("adam.m");
    const SafetensorsEntry* v = file.find("adam.v");
    HYLA_CHECK(m && v && m->dtype == DType::F32 && v->dtype == DType::F32 && m->shape.numel() == v->shape.numel(),
               "{}: 'adam.m' and 'adam.v' must be f32 tensors of one length", path.string());
    const int64_t count = m->shape.numel();
    HYLA_CHECK(first >= 0 && first + count <= params_.numel(), "{}: its shard [{}, {}) lies outside this model's {} parameters",
               path.string(), first, first + count, params_.numel());
    const int64_t lo = std::max(first, shard_.first), hi = std::min(first + count, shard_.end());
    if (lo < hi) {
      std::memcpy(m_.data<float>() + (lo - shard_.first), file.get("adam.m").data<float>() + (lo - first), size_t(hi - lo) * 4);
      std::memcpy(v_.data<float>() + (lo - shard_.first), file.get("adam.v").data<float>() + (lo - first), size_t(hi - lo) * 4);
      covered += hi - lo;
    }
    steps_ = file.get("adam.step").data<int64_t>()[0];
  }
  HYLA_CHECK(covered == shard_.count, "optimiser state: the {} shard file(s) cover {} of this shard's {} values ({})",
             paths.size(), covered, shard_.count, paths.empty() ? "" : paths.front().parent_path().string());
}

}  // namespace hyla
