#pragma once
// The model's parameters: each registered under its SPEC name with its initialiser and optimiser
// group, then laid out in one f32 value buffer and one f32 gradient buffer (llm.c style), so the
// optimiser, gradient norm and checkpointing each run one flat loop.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"
#include "hyla/model/param_count.h"

namespace hyla {

// SPEC §9 initialisers.
enum class Init : uint8_t {
  Normal,        // N(0, initializer_range)
  NormalOutput,  // N(0, initializer_range / sqrt(2 L)): o_proj, down_proj, lat_up
  Ones,          // RMSNorm weights
  Zeros,         // AttnRes queries, biases, the balancing bias
  ConvUniform,   // U(-1/sqrt(kernel), 1/sqrt(kernel)), kernel = last dim
  ALog,          // log U(1, 16)
  DtBias,        // dt + log(-expm1(-dt)), dt = exp(U(log 1e-3, log 0.1)) clamped >= 1e-4
};

struct Param {
  std::string name;
  Shape shape;
  Init init;
  Component component;
  bool weight_decay;  // false for norms, biases, A_log, dt_bias, AttnRes queries, router centres
  bool trainable;     // false for buffers (the balancing bias): no gradient, no optimiser update
  Tensor value;       // f32, a view into the store's value buffer
  Tensor grad;        // f32, a view into the gradient buffer (undefined for buffers)
  int64_t numel() const { return shape.numel(); }
  Tensor value_bf16;  // bf16 copy for matrix products, refreshed by ParamStore::refresh_bf16
  float* v() { return value.data<float>(); }
  float* g() { return grad.data<float>(); }
  const bf16* v16() const { return value_bf16.data<bf16>(); }
};

class ParamStore {
 public:
  Param& add(std::string name, Shape shape, Init init, Component component, bool weight_decay = true,
             bool trainable = true);
  // Lays out every registered parameter; no parameter can be added afterwards.
  void allocate();
  void initialize(const ModelConfig& config, uint64_t seed);

  const std::vector<std::unique_ptr<Param>>& params() const { return params_; }
  Param* find(const std::string& name) const;
  Param& get(const std::string& name) const;
  int64_t numel() const;  // sum over parameters (also before allocation)
  bool allocated() const { return allocated_; }
  float* values() { return values_.data<float>(); }
  float* grads() { return grads_.data<float>(); }
  bf16* values_bf16() { return values_bf16_.data<bf16>(); }
  void zero_grads();
  // Rounds every value into its bf16 copy (after initialisation, loading or an optimiser step).
  void refresh_bf16();

  // Tensors to save, converted to `dtype` (F32, BF16 or F16).
  NamedTensors named_values(DType dtype) const;
  // Loads every parameter from `weights` (F32, BF16 or F16), failing on a missing tensor, a
  // shape mismatch or an extra tensor the model does not have.
  void load(const ModelWeights& weights, const std::string& source);

 private:
  std::vector<std::unique_ptr<Param>> params_;
  std::map<std::string, Param*> by_name_;
  Tensor values_, grads_, values_bf16_;
  bool allocated_ = false;
};

}  // namespace hyla
