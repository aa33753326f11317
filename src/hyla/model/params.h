#pragma once
// The model's parameters: each registered under its SPEC name with its initialiser and optimiser
// group, then laid out in one f32 value buffer and one f32 gradient buffer (llm.c style), so the
// optimiser, gradient norm and checkpointing each run one flat loop.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/io/safetensors.h"
#include "hyla/kernels/ggml_gemm.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/mxfp4_gemm.h"
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
  Tensor value;       // f32, a view into the store's value buffer (undefined when bf16_only)
  Tensor grad;        // f32, a view into the gradient buffer (undefined for buffers)
  int64_t numel() const { return shape.numel(); }
  Tensor value_bf16;  // bf16 copy for matrix products, refreshed by ParamStore::refresh_bf16
  // A matrix-product weight [out, in] that `hyla quantize` may store as int8 (docs/quantization.md).
  bool int8_allowed = false;
  // The next registered parameter forms one matrix product with this one (a fused view), so a
  // model file must store both alike.
  bool fused_with_next = false;
  // The next registered parameter is multiplied by the same kernel as this one (a fused view, or a
  // routed expert's down_proj after its [gate; up]), so a model file must store both alike.
  bool stored_like_next = false;
  // Stored as int8 with one scale per int8_block inputs (> 0; inference only): `int8` holds the
  // packed weights and value, value_bf16 and grad are undefined.
  int64_t int8_block = 0;
  Int8PackedMatrix int8;
  // Stored as MXFP4 (routed experts' matrices only; inference only): `mxfp4` holds the packed weights and value, value_bf16 and
  // grad are undefined.
  bool stored_mxfp4 = false;
  Mxfp4PackedMatrix mxfp4;
  // Stored as ggml blocks of another quantised type (a GGUF's K, IQ, TQ or legacy matrices,
  // GgufQuantized::InPlace; inference only): `ggml` points into the file's memory map, which the
  // store keeps mapped; value, value_bf16 and grad are undefined.
  bool stored_ggml = false;
  GgmlMatrix ggml;
  // Held as its bf16 copy alone (inference at Precision::BF16, ModelLoadOptions::bf16_matrices):
  // value and grad are undefined, so an f32 product refuses it (Linear).
  bool bf16_only = false;
  // Whether this process holds the parameter (value, gradient, optimiser state). A parameter held
  // elsewhere (another process's experts, ParamStore::hold_only) is registered, so names, shapes
  // and model files stay whole, but has no memory here: value and grad stay undefined.
  bool held = true;
  float* v() { return value.data<float>(); }
  float* g() { return grad.data<float>(); }
  const bf16* v16() const { return value_bf16.data<bf16>(); }
  bool is_int8() const { return int8_block > 0; }
  bool is_mxfp4() const { return stored_mxfp4; }
  bool is_ggml() const { return stored_ggml; }
  bool is_quantized() const { return is_int8() || is_mxfp4() || is_ggml(); }
  bool mxfp4_allowed() const { return int8_allowed && component == Component::RoutedExperts; }
  // A float matrix whose every product under Precision::BF16 reads the bf16 copy alone: the
  // matrices Linear multiplies (those `hyla quantize` may make int8), routed experts excepted
  // (their kernels read f32 where the CPU lacks bf16 products).
  bool bf16_suffices() const { return int8_allowed && !is_quantized() && component != Component::RoutedExperts; }
};

// A range of the flat parameter buffers (ParamStore::values, grads): an optimiser's shard.
struct FlatRange {
  int64_t first = 0, count = 0;
  int64_t end() const { return first + count; }
};

// SPEC §9's initial values of `p` (its initialiser, from `seed` and its name alone), into its
// numel() floats at `out`.
void initial_values(const Param& p, const ModelConfig& config, uint64_t seed, float* out);

// The ggml blocks a tensor of `weights` is (MappedBytes::ggml_blocks), as they lie in the map;
// fails naming the file, tensor, type and block when a block's scale is not finite.
GgmlMatrix ggml_blocks_of(const ModelWeights& weights, const std::string& name, GgmlType type, int64_t rows,
                          int64_t cols);

class ParamStore {
 public:
  Param& add(std::string name, Shape shape, Init init, Component component, bool weight_decay = true,
             bool trainable = true);
  // Before allocate(), for a model file: checks every tensor against the registered parameters
  // (names, shapes, dtypes and the int8 and MXFP4 rules of docs/quantization.md) and marks the
  // parameters the file stores quantised.
  void plan_storage(const ModelWeights& weights, const std::string& source);
  // Before allocate(): this process holds only the parameters `holds` accepts (e.g.
  // holds_experts in expert_exchange.h); the others get no memory, no initialisation, no
  // gradient, are not saved and are skipped when loading.
  void hold_only(const std::function<bool(const Param&)>& holds);
  // Lays out every registered parameter; no parameter can be added afterwards. Float parameters
  // share one f32 buffer (and its bf16 copy); quantised ones one buffer of packed weights. A store
  // with quantised parameters serves inference only and has no gradients.
  void allocate();
  void initialize(const ModelConfig& config, uint64_t seed);

  const std::vector<std::unique_ptr<Param>>& params() const { return params_; }
  Param* find(const std::string& name) const;
  Param& get(const std::string& name) const;
  int64_t numel() const;  // sum over the held parameters: the length of the flat buffers (also before allocation)
  bool allocated() const { return allocated_; }
  bool has_quantized() const;  // any parameter stored int8 or MXFP4
  // The flat buffers over every parameter, for training (which needs float parameters).
  float* values();
  float* grads();
  bf16* values_bf16();
  void zero_grads();
  // Rounds every value into its bf16 copy (after initialisation, loading or an optimiser step).
  void refresh_bf16();

  // Tensors to save, converted to `dtype` (F32, BF16 or F16); float parameters only.
  NamedTensors named_values(DType dtype) const;
  // Loads every parameter from `weights`, laid out by plan_storage on the same file: float ones
  // from F32, BF16 or F16, int8 ones from I8 values and F32 scales (finite, ≥ 0), MXFP4 ones from
  // U8 codes and U8 scales (not 0xFF), packed; ggml-block ones pointed at their blocks in the map
  // (every block's scales finite).
  void load(const ModelWeights& weights, const std::string& source);

 private:
  // plan_storage for a U8 tensor: checks the MXFP4 rules and marks `p` MXFP4.
  void plan_mxfp4(Param& p, const ModelWeights& weights, const std::string& source);
  // plan_storage for ggml blocks (MappedBytes::ggml_blocks): checks their shape and marks `p`.
  void plan_ggml(Param& p, const ModelWeights& weights, const std::string& source);

  std::vector<std::unique_ptr<Param>> params_;
  std::map<std::string, Param*> by_name_;
  Tensor values_, grads_, values_bf16_;
  Tensor quantized_;  // packed int8 and MXFP4 weights
  std::vector<std::shared_ptr<const MappedFile>> mapped_;  // the maps that ggml-block parameters point into
  bool allocated_ = false;
  bool bf16_only_ = false;  // some parameter is bf16_only: the value buffers have different layouts
};

}  // namespace hyla
