#include "hyla/model/hf_config.h"

#include <type_traits>
#include <utility>

#include "hyla/core/error.h"

namespace hyla {
namespace {

using json = nlohmann::json;

// Reads of one JSON object with the file and the key's dotted path in every error; null counts as
// absent (HF writes "q_lora_rank": null).
class HfFields {
 public:
  HfFields(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  std::string path(const std::string& key) const { return prefix_ + key; }
  const json* find(const std::string& key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  template <typename T>
  T value(const std::string& key, T fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if constexpr (std::is_same_v<T, bool>) {
      HYLA_CHECK(v->is_boolean(), "{}: {} must be true or false", source_, path(key));
    } else if constexpr (std::is_integral_v<T>) {
      HYLA_CHECK(v->is_number_integer(), "{}: {} must be an integer", source_, path(key));
    } else if constexpr (std::is_floating_point_v<T>) {
      HYLA_CHECK(v->is_number(), "{}: {} must be a number", source_, path(key));
    } else {
      HYLA_CHECK(v->is_string(), "{}: {} must be a string", source_, path(key));
    }
    return v->get<T>();
  }
  template <typename T>
  T required(const std::string& key) const {
    HYLA_CHECK(has(key), "{}: {} is required", source_, path(key));
    return value<T>(key, T{});
  }
  HfFields object(const std::string& key) const {
    const json* v = find(key);
    HYLA_CHECK(v && v->is_object(), "{}: {} must be an object", source_, path(key));
    return HfFields(*v, source_, path(key) + ".");
  }
  const json& raw(const std::string& key) const {
    const json* v = find(key);
    HYLA_CHECK(v, "{}: {} is required", source_, path(key));
    return *v;
  }
  [[noreturn]] void reject(const std::string& key, const std::string& rule) const {
    ::hyla::fail("{}: {} {}", source_, path(key), rule);
  }

 private:
  const json& object_;
  std::string source_, prefix_;
};

}  // namespace

bool is_hf_config(const json& j) {
  return j.is_object() && j.contains("model_type") && j["model_type"].is_string() && j["model_type"] != "hyla";
}

ModelConfig config_from_hf(const json& top, const std::string& source) {
  const std::string model_type = top.value("model_type", "");
  if (model_type != "kimi_k3" && model_type != "kimi_linear")
    fail("{}: model_type \"{}\" is not an architecture hyla reads (kimi_k3, kimi_linear, or hyla's own)", source,
              model_type);
  const bool nested = model_type == "kimi_k3";
  const HfFields f = nested ? HfFields(top, source, "").object("text_config") : HfFields(top, source, "");

  ModelConfig c;
  c.vocab_size = f.required<int64_t>("vocab_size");
  c.hidden_size = f.required<int64_t>("hidden_size");
  c.num_hidden_layers = f.required<int64_t>("num_hidden_layers");
  c.rms_norm_eps = f.value("rms_norm_eps", c.rms_norm_eps);
  c.tie_word_embeddings = f.value("tie_word_embeddings", false);
  c.initializer_range = f.value("initializer_range", c.initializer_range);
  c.max_position_embeddings = f.value("max_position_embeddings", c.max_position_embeddings);

  const HfFields linear = f.object("linear_attn_config");
  c.layer_types.assign(size_t(c.num_hidden_layers), LayerType::Kda);
  const json& full = linear.raw("full_attn_layers");
  HYLA_CHECK(full.is_array(), "{}: {} must be a list of 1-based layer numbers", source, linear.path("full_attn_layers"));
  for (const json& layer : full) {
    HYLA_CHECK(layer.is_number_integer() && layer.get<int64_t>() >= 1 && layer.get<int64_t>() <= c.num_hidden_layers,
               "{}: {} holds {}, not a 1-based layer number in [1, {}]", source, linear.path("full_attn_layers"),
               layer.dump(), c.num_hidden_layers);
    c.layer_types[size_t(layer.get<int64_t>() - 1)] = LayerType::Mla;
  }
  c.kda.num_heads = linear.required<int64_t>("num_heads");
  c.kda.head_dim = linear.required<int64_t>("head_dim");
  c.kda.conv_kernel = linear.value<int64_t>("short_conv_kernel_size", c.kda.conv_kernel);
  if (linear.has("gate_lower_bound")) {
    c.kda.gate = KdaGate::LowerBound;
    c.kda.gate_lower_bound = linear.value("gate_lower_bound", c.kda.gate_lower_bound);
  } else {
    c.kda.gate = KdaGate::Softplus;
  }
  c.kda.gate_rank = c.kda.head_dim;
  c.kda.output_gate_rank = linear.value("use_full_rank_gate", false) ? 0 : c.kda.head_dim;

  c.mla.num_heads = f.required<int64_t>("num_attention_heads");
  c.mla.q_lora_rank = f.value<int64_t>("q_lora_rank", 0);
  c.mla.kv_lora_rank = f.required<int64_t>("kv_lora_rank");
  c.mla.qk_nope_head_dim = f.required<int64_t>("qk_nope_head_dim");
  c.mla.qk_rope_head_dim = f.value<int64_t>("qk_rope_head_dim", 0);
  c.mla.v_head_dim = f.required<int64_t>("v_head_dim");
  c.mla.rope_theta = f.value("rope_theta", c.mla.rope_theta);
  c.mla.rope = !f.value("mla_use_nope", false);
  c.mla.output_gate = f.value("mla_use_output_gate", false);

  MoeConfig& m = c.moe;
  m.num_experts = f.required<int64_t>("num_experts");
  m.num_experts_per_tok = f.has("num_experts_per_token") ? f.value<int64_t>("num_experts_per_token", 0)
                                                         : f.required<int64_t>("num_experts_per_tok");
  m.num_shared_experts = f.value<int64_t>("num_shared_experts", 0);
  m.moe_intermediate_size = f.required<int64_t>("moe_intermediate_size");
  m.first_k_dense_replace = f.value<int64_t>("first_k_dense_replace", 0);
  m.intermediate_size = f.value<int64_t>("intermediate_size", m.intermediate_size);
  m.routed_scaling_factor = f.value("routed_scaling_factor", 1.0);
  m.latent_dim = f.value<int64_t>("routed_expert_hidden_size", 0);
  if (m.latent_dim > 0 && !f.value("latent_moe_use_norm", true))
    f.reject("latent_moe_use_norm", "is false: SPEC §5's latent MoE always norms m before lat_up");
  if (f.value<int64_t>("num_expert_group", 1) > 1 || f.value<int64_t>("topk_group", 1) > 1)
    f.reject("num_expert_group", "> 1: grouped routing is not implemented (SPEC §5 routes over all experts)");
  if (const std::string router = f.value<std::string>("moe_router_activation_func", "sigmoid"); router != "sigmoid")
    f.reject("moe_router_activation_func", fmt::format("is \"{}\": SPEC §5's router is a sigmoid", router));
  if (!f.value("moe_renormalize", true))
    f.reject("moe_renormalize", "is false: SPEC §5 renormalises the selected experts' weights");
  if (f.value<int64_t>("moe_layer_freq", 1) != 1) f.reject("moe_layer_freq", "must be 1 (every layer after the dense ones)");
  const std::string act = f.value<std::string>("hidden_act", "silu");
  if (act == "situ") {
    m.activation = m.dense_activation = m.shared_activation = Activation::Situ;
    m.situ_beta = f.value("activation_situ_beta", m.situ_beta);
    m.situ_linear_beta = f.value("activation_situ_linear_beta", 0.0);
    m.shared_full_width = true;
  } else if (act != "silu") {
    f.reject("hidden_act", fmt::format("is \"{}\": hyla reads \"silu\" (swiglu) and \"situ\"", act));
  }
  c.attn_res.enabled = f.has("attn_res_block_size");
  if (c.attn_res.enabled) c.attn_res.block_size = f.value<int64_t>("attn_res_block_size", 0);
  c.validate(source);
  return c;
}

}  // namespace hyla
