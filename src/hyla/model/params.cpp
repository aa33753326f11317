#include "hyla/model/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hyla/core/arith.h"
#include "hyla/core/random.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/mxfp4_weights.h"
#include "hyla/model/weight_values.h"

namespace hyla {
namespace {

void check_float_store(bool quantized) {
  HYLA_CHECK(!quantized, "the model has int8 or MXFP4 weights (from hyla quantize or a checkpoint), which serve "
                         "inference only; training and checkpoints need the floating-point model");
}

}  // namespace

Param& ParamStore::add(std::string name, Shape shape, Init init, Component component, bool weight_decay,
                       bool trainable) {
  HYLA_ASSERT(!allocated_);
  HYLA_ASSERT(!by_name_.count(name));
  Param& p = *params_.emplace_back(std::make_unique<Param>());
  p.name = std::move(name);
  p.shape = shape;
  p.init = init;
  p.component = component;
  p.weight_decay = weight_decay;
  p.trainable = trainable;
  by_name_[p.name] = &p;
  return p;
}

void ParamStore::plan_storage(const ModelWeights& weights, const std::string& source) {
  HYLA_ASSERT(!allocated_);
  for (const auto& p : params_) {
    HYLA_CHECK(weights.contains(p->name), "{}: missing tensor '{}' required by config.json", source, p->name);
    const SafetensorsEntry& e = weights.entry(p->name);
    p->int8_block = 0;
    p->stored_mxfp4 = false;
    p->stored_ggml = false;
    if (const MappedBytes* m = weights.mapped_source(p->name); m && m->ggml_blocks && *m->ggml_blocks != GgmlType::MXFP4) {
      plan_ggml(*p, weights, source);
      continue;
    }
    if (e.dtype == DType::U8) {
      plan_mxfp4(*p, weights, source);
      continue;
    }
    HYLA_CHECK(e.shape == p->shape, "{}: tensor '{}' has shape {} but config.json needs {}", source, p->name,
               e.shape.str(), p->shape.str());
    if (e.dtype != DType::I8) {
      HYLA_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16,
                 "{}: tensor '{}' has dtype {}; model weights must be F32, BF16, F16, (matrix-product weights) I8 or "
                 "(routed experts) U8 MXFP4 codes",
                 source, p->name, dtype_name(e.dtype));
      continue;
    }
    HYLA_CHECK(p->int8_allowed, "{}: tensor '{}' is I8, but only matrix-product weights may be int8; it must be F32, BF16 or F16",
               source, p->name);
    const int64_t block = int8_block_from_metadata(weights.metadata_of(p->name), weights.file_of(p->name));
    const int64_t out = p->shape[0], in = p->shape[1];
    HYLA_CHECK(in % block == 0, "{}: int8 tensor '{}' has {} input features, not a multiple of the block {}", source,
               p->name, in, block);
    const std::string scale = int8_scale_name(p->name);
    HYLA_CHECK(weights.contains(scale), "{}: missing tensor '{}' (the scales of int8 tensor '{}')", source, scale, p->name);
    const SafetensorsEntry& s = weights.entry(scale);
    HYLA_CHECK(s.dtype == DType::F32, "{}: tensor '{}' has dtype {}; int8 scales must be F32", source, scale,
               dtype_name(s.dtype));
    HYLA_CHECK(s.shape == Shape({out, in / block}), "{}: tensor '{}' has shape {} but int8 tensor '{}' {} with block {} needs {}",
               source, scale, s.shape.str(), p->name, p->shape.str(), block, Shape({out, in / block}).str());
    p->int8_block = block;
  }
  const auto storage = [](const Param& p) {
    return p.is_int8() ? "I8" : p.is_mxfp4() ? "MXFP4" : p.is_ggml() ? "ggml blocks" : "floating point";
  };
  for (size_t i = 0; i + 1 < params_.size(); ++i) {
    const Param &a = *params_[i], &b = *params_[i + 1];
    HYLA_CHECK(!a.stored_like_next ||
                   (a.int8_block == b.int8_block && a.is_mxfp4() == b.is_mxfp4() && a.is_ggml() == b.is_ggml()),
               "{}: tensors '{}' and '{}' run in one kernel and must be stored alike, but one is {} and the other {}",
               source, a.name, b.name, storage(a), storage(b));
  }
  for (const std::string& name : weights.names()) {
    if (by_name_.count(name)) continue;
    const std::string base = name.size() > 6 && name.ends_with(".scale") ? name.substr(0, name.size() - 6) : "";
    const Param* scaled = find(base);
    HYLA_CHECK(scaled && scaled->is_quantized(), "{}: tensor '{}' is not a parameter of this config{}", source, name,
               scaled ? fmt::format(" (it would scale '{}', which is neither I8 nor MXFP4)", base) : "");
  }
}

void ParamStore::plan_mxfp4(Param& p, const ModelWeights& weights, const std::string& source) {
  const SafetensorsEntry& e = weights.entry(p.name);
  HYLA_CHECK(p.mxfp4_allowed(),
             "{}: tensor '{}' is U8 (MXFP4 codes), but only routed experts' matrices may be MXFP4; it must be F32, "
             "BF16, F16{}",
             source, p.name, p.int8_allowed ? " or I8" : "");
  const int64_t out = p.shape[0], in = p.shape[1];
  HYLA_CHECK(in % kMxfp4Block == 0, "{}: MXFP4 tensor '{}' has {} input features, not a multiple of 32", source, p.name,
             in);
  HYLA_CHECK(e.shape == Shape({out, in / 2}),
             "{}: tensor '{}' has shape {}, but MXFP4 codes of a {} matrix (two a byte) need {}", source, p.name,
             e.shape.str(), p.shape.str(), Shape({out, in / 2}).str());
  const std::string scale = mxfp4_scale_name(p.name);
  HYLA_CHECK(weights.contains(scale), "{}: missing tensor '{}' (the scales of MXFP4 tensor '{}')", source, scale, p.name);
  const SafetensorsEntry& s = weights.entry(scale);
  HYLA_CHECK(s.dtype == DType::U8 && s.shape == Shape({out, in / kMxfp4Block}),
             "{}: tensor '{}' is {} {}, but MXFP4 tensor '{}' needs U8 E8M0 scales {}", source, scale,
             dtype_name(s.dtype), s.shape.str(), p.name, Shape({out, in / kMxfp4Block}).str());
  p.stored_mxfp4 = true;
}

GgmlMatrix ggml_blocks_of(const ModelWeights& weights, const std::string& name, GgmlType type, int64_t rows,
                          int64_t cols) {
  check_weight_values(weights, name);
  return {weights.mapped_source(name)->begin, type, rows, cols};
}

void ParamStore::plan_ggml(Param& p, const ModelWeights& weights, const std::string& source) {
  const GgmlType type = *weights.mapped_source(p.name)->ggml_blocks;
  const std::string type_name = ggml_type_name(uint32_t(type));
  HYLA_CHECK(p.int8_allowed, "{}: tensor '{}' is {}, but only matrix-product weights may be quantised", source, p.name,
             type_name);
  const int64_t out = p.shape[0], in = p.shape[1];
  HYLA_CHECK(in % ggml_block_values(type) == 0, "{}: {} tensor '{}' has {} input features, not a multiple of its block {}",
             source, type_name, p.name, in, ggml_block_values(type));
  const Shape blocks{out, int64_t(ggml_bytes(type, in))};
  HYLA_CHECK(weights.entry(p.name).shape == blocks, "{}: {} tensor '{}' holds {} bytes of blocks, but a {} matrix needs {}",
             source, type_name, p.name, weights.entry(p.name).shape.str(), p.shape.str(), blocks.str());
  p.stored_ggml = true;
  p.ggml = {nullptr, type, out, in};
}

void ParamStore::allocate() {
  HYLA_ASSERT(!allocated_);
  // No padding between float parameters: parameters registered one after another with the same
  // input width form one matrix, so fused projections (e.g. KDA's q k v f g b) are one GEMM. (The
  // quantised kernels take a fused matrix as a list of packed parts; each part starts 64-byte
  // aligned.)
  const auto packed_bytes = [](const Param& p) {
    return round_up(p.is_int8() ? int8_packed_bytes(p.shape[0], p.shape[1], p.int8_block)
                                : mxfp4_packed_bytes(p.shape[0], p.shape[1]),
                    64);
  };
  int64_t total = 0, bf16_total = 0, quantized_bytes = 0;
  for (const auto& p : params_) {
    if (!p->held) continue;
    HYLA_ASSERT(!p->bf16_only || p->bf16_suffices());
    if (p->is_ggml()) continue;  // read in the map
    if (p->is_quantized()) quantized_bytes += packed_bytes(*p);
    else bf16_total += p->numel(), total += p->bf16_only ? 0 : p->numel();
    bf16_only_ = bf16_only_ || p->bf16_only;
  }
  const bool training = !has_quantized() && !bf16_only_;
  values_ = Tensor::zeros(DType::F32, {total});
  values_bf16_ = Tensor::zeros(DType::BF16, {bf16_total});
  if (training) grads_ = Tensor::zeros(DType::F32, {total});
  else quantized_ = Tensor::empty(DType::U8, {quantized_bytes});
  int64_t offset = 0, bf16_offset = 0, quantized_offset = 0;
  for (const auto& p : params_) {
    if (!p->held || p->is_ggml()) continue;
    if (p->is_quantized()) {
      const uint8_t* data = quantized_.data<uint8_t>() + quantized_offset;
      if (p->is_int8()) p->int8 = {data, p->shape[0], p->shape[1], p->int8_block};
      else p->mxfp4 = {data, p->shape[0], p->shape[1]};
      quantized_offset += packed_bytes(*p);
      continue;
    }
    // Fused parts stay contiguous in both buffers: they are bf16_only alike (Linear's matrices).
    p->value_bf16 = Tensor::view(DType::BF16, p->shape, values_bf16_.data<bf16>() + bf16_offset, nullptr);
    bf16_offset += p->numel();
    if (p->bf16_only) continue;
    p->value = Tensor::view(DType::F32, p->shape, values_.data<float>() + offset, nullptr);
    if (training && p->trainable) p->grad = Tensor::view(DType::F32, p->shape, grads_.data<float>() + offset, nullptr);
    offset += p->numel();
  }
  allocated_ = true;
}

void initial_values(const Param& p, const ModelConfig& config, uint64_t seed, float* v) {
  const double std_dev = config.initializer_range;
  const double output_std = std_dev / std::sqrt(2.0 * double(config.num_hidden_layers));
  uint64_t mix = seed ^ hash_string(p.name);
  Rng rng(splitmix64(mix));  // per-name stream: independent of registration order and threads
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

void ParamStore::initialize(const ModelConfig& config, uint64_t seed) {
  HYLA_ASSERT(allocated_);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i]->held) initial_values(*params_[i], config, seed, params_[i]->v());
}

int64_t ParamStore::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p->held ? p->numel() : 0;
  return n;
}

void ParamStore::hold_only(const std::function<bool(const Param&)>& holds) {
  HYLA_ASSERT(!allocated_);
  for (const auto& p : params_) p->held = holds(*p);
  for (size_t i = 0; i + 1 < params_.size(); ++i)  // a fused matrix product is held whole or not at all
    HYLA_ASSERT(!params_[i]->fused_with_next || params_[i]->held == params_[i + 1]->held);
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

bool ParamStore::has_quantized() const {
  return std::any_of(params_.begin(), params_.end(), [](const auto& p) { return p->is_quantized(); });
}

float* ParamStore::values() {
  check_float_store(has_quantized());
  return values_.data<float>();
}

float* ParamStore::grads() {
  check_float_store(has_quantized());
  return grads_.data<float>();
}

bf16* ParamStore::values_bf16() {
  check_float_store(has_quantized());
  return values_bf16_.data<bf16>();
}

void ParamStore::zero_grads() { std::memset(grads(), 0, grads_.nbytes()); }

void ParamStore::refresh_bf16() {
  const int64_t block = int64_t(1) << 16;
  if (!bf16_only_) {  // the two buffers share one layout
    const int64_t n = values_.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += block)
      convert(values_.data<float>() + i, values_bf16_.data<bf16>() + i, size_t(std::min(block, n - i)));
    return;
  }
  for (const auto& p : params_) {
    if (!p->held || p->is_quantized() || p->bf16_only) continue;
    const int64_t n = p->numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += block)
      convert(p->v() + i, const_cast<bf16*>(p->v16()) + i, size_t(std::min(block, n - i)));
  }
}

NamedTensors ParamStore::named_values(DType dtype) const {
  check_float_store(has_quantized());
  HYLA_CHECK(!bf16_only_, "a model loaded with bf16 matrices only (for inference) cannot be saved");
  NamedTensors out;
  for (const auto& p : params_)
    if (p->held) out.emplace_back(p->name, dtype == DType::F32 ? p->value : p->value.to(dtype));
  return out;
}

void ParamStore::load(const ModelWeights& weights, const std::string& source) {
  HYLA_ASSERT(allocated_);
  constexpr uint64_t kReleaseBytes = uint64_t(256) << 20;
  uint64_t unreleased = 0;
  for (const auto& p : params_) {
    if (!p->held) continue;
    const SafetensorsEntry& e = weights.entry(p->name);
    HYLA_ASSERT((e.dtype == DType::I8) == p->is_int8() && (e.dtype == DType::U8) == (p->is_mxfp4() || p->is_ggml()));
    const size_t n = size_t(p->numel());
    if (p->is_ggml()) {
      p->ggml = ggml_blocks_of(weights, p->name, p->ggml.type, p->shape[0], p->shape[1]);
      const auto& file = weights.mapped_source(p->name)->file;
      if (std::find(mapped_.begin(), mapped_.end(), file) == mapped_.end()) mapped_.push_back(file);
      continue;  // nothing copied: no pages to release
    }
    if (p->is_mxfp4()) {
      pack_mxfp4_weight(weights, p->name, p->shape[0], p->shape[1], const_cast<uint8_t*>(p->mxfp4.data), source);
    } else {
      const Tensor t = weights.get(p->name);  // fetched once: a GGUF tensor stored as another type is decoded here
      if (!p->is_int8()) check_float_values(t, weights.file_of(p->name), p->name);
      if (p->is_int8()) {
        const Tensor scales = weights.get(int8_scale_name(p->name));
        const float* s = scales.data<float>();
        check_int8_scales(s, scales.numel(), source, p->name);
        int8_pack(t.data<int8_t>(), s, p->shape[0], p->shape[1], p->int8_block, const_cast<uint8_t*>(p->int8.data));
      } else if (p->bf16_only) {
        bf16* out = const_cast<bf16*>(p->v16());
        if (e.dtype == DType::BF16) {
          std::memcpy(out, t.data<bf16>(), n * 2);
        } else if (e.dtype == DType::F32) {
          convert(t.data<float>(), out, n);
        } else {  // through f32, as refresh_bf16 rounds a loaded f16 value
          std::vector<float> row(size_t(1) << 16);
          for (size_t i = 0; i < n; i += row.size()) {
            const size_t m = std::min(row.size(), n - i);
            convert(t.data<f16>() + i, row.data(), m);
            convert(row.data(), out + i, m);
          }
        }
      } else if (e.dtype == DType::F32) {
        std::memcpy(p->v(), t.data<float>(), n * 4);
      } else if (e.dtype == DType::BF16) {
        convert(t.data<bf16>(), p->v(), n);
      } else {
        convert(t.data<f16>(), p->v(), n);
      }
    }
    // What was read is copied: the file's pages leave the resident set (a model larger than
    // memory loads its resident part without holding the file's pages it read), every
    // kReleaseBytes rather than per tensor, since each release walks the whole mapping.
    unreleased += e.end - e.begin;
    if (unreleased >= kReleaseBytes) weights.release_pages(), unreleased = 0;
  }
  weights.release_pages();
}

}  // namespace hyla
