#include "hyla/model/params.h"

#include <cmath>
#include <cstring>

#include "hyla/core/random.h"

namespace hyla {

Param& ParamStore::add(std::string name, Shape shape, Init init, Component component, bool weight_decay,
                       bool trainable) {
  HYLA_ASSERT(!allocated_);
  HYLA_ASSERT(!by_name_.count(name));
  params_.push_back(std::make_unique<Param>(Param{std::move(name), shape, init, component, weight_decay, trainable, {}, {}, {}}));
  Param& p = *params_.back();
  by_name_[p.name] = &p;
  return p;
}

void ParamStore::allocate() {
  HYLA_ASSERT(!allocated_);
  // No padding between parameters: parameters registered one after another with the same input
  // width form one matrix, so fused projections (e.g. KDA's q k v f g b) are one GEMM.
  int64_t total = 0;
  for (const auto& p : params_) total += p->numel();
  values_ = Tensor::zeros(DType::F32, {total});
  grads_ = Tensor::zeros(DType::F32, {total});
  values_bf16_ = Tensor::zeros(DType::BF16, {total});
  int64_t offset = 0;
  for (const auto& p : params_) {
    p->value = Tensor::view(DType::F32, p->shape, values_.data<float>() + offset, nullptr);
    p->value_bf16 = Tensor::view(DType::BF16, p->shape, values_bf16_.data<bf16>() + offset, nullptr);
    if (p->trainable) p->grad = Tensor::view(DType::F32, p->shape, grads_.data<float>() + offset, nullptr);
    offset += p->numel();
  }
  allocated_ = true;
}

void ParamStore::initialize(const ModelConfig& config, uint64_t seed) {
  HYLA_ASSERT(allocated_);
  const double std_dev = config.initializer_range;
  const double output_std = std_dev / std::sqrt(2.0 * double(config.num_hidden_layers));
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    uint64_t mix = seed ^ hash_string(p.name);
    Rng rng(splitmix64(mix));  // per-name stream: independent of registration order and threads
    float* v = p.v();
    const int64_t n = p.numel();
    switch (p.init) {
      case Init::Normal:
        for (int64_t j = 0; j < n; ++j) v[j] = float(std_dev * rng.normal());
        break;
      case Init::NormalOutput:
        for (int64_t j = 0; j < n; ++j) v[j] = float(output_std * rng.normal());
        break;
      case Init::Ones:
        for (int64_t j = 0; j < n; ++j) v[j] = 1.0f;
        break;
      case Init::Zeros:
        for (int64_t j = 0; j < n; ++j) v[j] = 0.0f;
        break;
      case Init::ConvUniform: {
        const double bound = 1.0 / std::sqrt(double(p.shape[p.shape.ndim() - 1]));
        for (int64_t j = 0; j < n; ++j) v[j] = float(rng.uniform(-bound, bound));
        break;
      }
      case Init::ALog:
        for (int64_t j = 0; j < n; ++j) v[j] = float(std::log(rng.uniform(1.0, 16.0)));
        break;
      case Init::DtBias:
        for (int64_t j = 0; j < n; ++j) {
          const double dt = std::max(std::exp(rng.uniform(std::log(1e-3), std::log(0.1))), 1e-4);
          v[j] = float(dt + std::log(-std::expm1(-dt)));  // inverse softplus
        }
        break;
    }
  }
}

int64_t ParamStore::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p->numel();
  return n;
}

Param* ParamStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Param& ParamStore::get(const std::string& name) const {
  Param* p = find(name);
  HYLA_CHECK(p, "model has no parameter named '{}'", name);
  return *p;
}

void ParamStore::zero_grads() { std::memset(grads_.raw(), 0, grads_.nbytes()); }

void ParamStore::refresh_bf16() {
  const int64_t n = values_.numel(), block = int64_t(1) << 16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += block)
    convert(values_.data<float>() + i, values_bf16_.data<bf16>() + i, size_t(std::min(block, n - i)));
}

NamedTensors ParamStore::named_values(DType dtype) const {
  NamedTensors out;
  for (const auto& p : params_) out.emplace_back(p->name, dtype == DType::F32 ? p->value : p->value.to(dtype));
  return out;
}

void ParamStore::load(const ModelWeights& weights, const std::string& source) {
  HYLA_ASSERT(allocated_);
  for (const auto& p : params_) {
    HYLA_CHECK(weights.contains(p->name), "{}: missing tensor '{}'", source, p->name);
    const SafetensorsEntry& e = weights.entry(p->name);
    HYLA_CHECK(e.shape == p->shape, "{}: tensor '{}' has shape {} but the config needs {}", source, p->name,
               e.shape.str(), p->shape.str());
    HYLA_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16,
               "{}: tensor '{}' has dtype {}; model weights must be F32, BF16 or F16", source, p->name,
               dtype_name(e.dtype));
    const Tensor t = weights.get(p->name);
    const size_t n = size_t(p->numel());
    if (e.dtype == DType::F32) std::memcpy(p->v(), t.data<float>(), n * 4);
    else if (e.dtype == DType::BF16) convert(t.data<bf16>(), p->v(), n);
    else convert(t.data<f16>(), p->v(), n);
  }
  for (const std::string& name : weights.names())
    HYLA_CHECK(by_name_.count(name), "{}: tensor '{}' is not a parameter of this config", source, name);
}

}  // namespace hyla
