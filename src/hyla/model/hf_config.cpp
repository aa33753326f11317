#include "hyla/model/hf_config.h"

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

namespace hyla {
namespace {

using json = nlohmann::json;

// HF writes settings that do not apply as null ("q_lora_rank": null): dropped, they read as absent.
json without_nulls(const json& j) {
  if (!j.is_object()) return j;
  json out = json::object();
  for (const auto& [key, value] : j.items())
    if (!value.is_null()) out[key] = without_nulls(value);
  return out;
}

template <typename T>
void read_required(JsonFields& f, const std::string& source, const char* key, T& out) {
  HYLA_CHECK(f.has(key), "{}: {} is required", source, f.path(key));
  f.read(key, out);
}

// Kimi K3's vision_config (SPEC §7.2): MoonViT and its projector. What hyla does not implement
// (video's temporal pooling aside, which images never reach) is refused by name.
void read_vision_config(JsonFields& v, const std::string& source, ModelConfig& c) {
  auto reject = [&](const char* key, const std::string& rule) { v.fail_rule(v.path(key) + " " + rule); };
  auto expect = [&](const char* key, const std::string& value) {
    std::string got = value;
    v.read(key, got);
    if (got != value) reject(key, fmt::format("is \"{}\": hyla's MoonViT reads \"{}\"", got, value));
  };
  VisionConfig& vision = c.vision;
  MoonVitConfig& m = vision.moonvit;
  vision.enabled = true, vision.tower = VisionTower::MoonVit, vision.channels = 3, vision.patch_size = 14;
  v.read("patch_size", vision.patch_size);
  read_required(v, source, "vt_hidden_size", m.hidden_size);
  read_required(v, source, "vt_num_attention_heads", m.num_heads);
  read_required(v, source, "vt_num_hidden_layers", m.num_layers);
  read_required(v, source, "vt_intermediate_size", m.intermediate_size);
  int64_t qkv = m.hidden_size;
  v.read("qkv_hidden_size", qkv);
  if (m.num_heads <= 0 || qkv % m.num_heads != 0) reject("qkv_hidden_size", "is not a whole number of heads");
  m.head_dim = qkv / std::max<int64_t>(m.num_heads, 1);
  v.read("init_pos_emb_height", m.pos_emb_height);
  v.read("init_pos_emb_width", m.pos_emb_width);
  std::vector<int64_t> merge = {2, 2};
  v.read("merge_kernel_size", merge);
  if (merge.size() != 2 || merge[0] != merge[1]) reject("merge_kernel_size", "must be a square window [m, m]");
  m.merge = merge[0];  // the check above leaves [m, m]
  std::string resample = "bilinear", norm = "rmsnorm", projector = "patchmergerv2";
  v.read("pos_emb_interpolation_mode", resample);
  if (resample != "bilinear" && resample != "bicubic") reject("pos_emb_interpolation_mode", "must be bilinear or bicubic");
  m.pos_emb_resample = resample == "bicubic" ? GridResample::Bicubic : GridResample::Bilinear;
  v.read("norm_type", norm);
  if (norm != "rmsnorm" && norm != "layernorm") reject("norm_type", "must be rmsnorm or layernorm");
  m.norm = norm == "rmsnorm" ? VisionNorm::RmsNorm : VisionNorm::LayerNorm;
  // The official code builds nn.RMSNorm without an eps and runs the tower in bf16: PyTorch then
  // uses bf16's machine epsilon, 2^-7. nn.LayerNorm's default is 1e-5.
  m.norm_eps = m.norm == VisionNorm::RmsNorm ? 0.0078125 : 1e-5;
  bool attn_bias = false, linear_bias = false, patch_bias = false;
  v.read("attn_bias", attn_bias);
  v.read("linear_bias", linear_bias);
  v.read("patch_embed_proj_bias", patch_bias);
  if (attn_bias != linear_bias || attn_bias != patch_bias)
    reject("attn_bias", "must equal linear_bias and patch_embed_proj_bias (hyla's MoonViT has one bias option)");
  m.bias = attn_bias;
  v.read("mm_projector_type", projector);
  if (projector != "patchmergerv2" && projector != "patchmerger") reject("mm_projector_type", "must be patchmergerv2 or patchmerger");
  m.projector = projector == "patchmerger" ? VisionProjector::PatchMerger : VisionProjector::PatchMergerV2;
  v.read("projector_ln_eps", m.projector_eps);
  int64_t mm_hidden = m.hidden_size, text_hidden = c.hidden_size;
  v.read("mm_hidden_size", mm_hidden);
  if (mm_hidden != m.hidden_size) reject("mm_hidden_size", "must equal vt_hidden_size");
  v.read("text_hidden_size", text_hidden);
  if (text_hidden != c.hidden_size) reject("text_hidden_size", "must equal the text model's hidden_size");
  expect("activation_func", "gelu_pytorch_tanh");
  std::string projector_act = "gelu";
  v.read("projector_hidden_act", projector_act);
  if (projector_act != "gelu" && projector_act != "gelu_pytorch_tanh")
    reject("projector_hidden_act", "must be gelu (erf) or gelu_pytorch_tanh");
  m.projector_gelu = projector_act == "gelu" ? Gelu::Erf : Gelu::Tanh;
  expect("merge_type", "sd2_tpool");
  expect("mlp_type", "mlp2");
  expect("pos_emb_type", "divided_fixed");
}

}  // namespace

void read_hf_preprocessor_config(const json& file, const std::string& source, ModelConfig& c) {
  HYLA_CHECK(file.is_object(), "{}: not a JSON object", source);
  HYLA_CHECK(c.vision.enabled && c.vision.tower == VisionTower::MoonVit,
             "{}: a preprocessor config, but the model has no MoonViT tower", source);
  const bool nested = file.contains("media_proc_cfg");
  HYLA_CHECK(!nested || file["media_proc_cfg"].is_object(), "{}: media_proc_cfg is not an object", source);
  JsonFields f(nested ? file["media_proc_cfg"] : file, source, nested ? "media_proc_cfg" : "");
  MoonVitConfig& m = c.vision.moonvit;
  f.read("in_patch_limit", m.in_patch_limit);
  f.read("patch_limit_on_one_side", m.patch_limit_on_one_side);
  f.read("image_mean", m.image_mean);
  f.read("image_std", m.image_std);
  int64_t patch = c.vision.patch_size;
  f.read("patch_size", patch);
  if (patch != c.vision.patch_size)
    f.fail_rule(fmt::format("{} is {}, vision_config's patch_size {}", f.path("patch_size"), patch, c.vision.patch_size));
  if (f.has("merge_kernel_size")) {
    std::vector<int64_t> merge;
    if (f.raw("merge_kernel_size").is_array()) {
      f.read("merge_kernel_size", merge);
    } else {
      int64_t m1 = 0;
      f.read("merge_kernel_size", m1);
      merge = {m1, m1};
    }
    if (merge != std::vector<int64_t>{m.merge, m.merge})
      f.fail_rule(fmt::format("{} is not vision_config's merge [{}, {}]", f.path("merge_kernel_size"), m.merge, m.merge));
  }
  c.validate(source);
}

bool is_hf_config(const json& j) {
  return j.is_object() && j.contains("model_type") && j["model_type"].is_string() && j["model_type"] != "hyla";
}

ModelConfig config_from_hf(const json& file, const std::string& source) {
  const std::string model_type = file.value("model_type", "");
  if (model_type != "kimi_k3" && model_type != "kimi_linear")
    fail("{}: model_type \"{}\" is not an architecture hyla reads (kimi_k3, kimi_linear, or hyla's own)", source,
         model_type);
  const json top = without_nulls(file);
  JsonFields root(top, source);
  JsonFields f = model_type == "kimi_k3" ? root.object("text_config") : root;
  auto reject = [&](const char* key, const std::string& rule) { f.fail_rule(f.path(key) + " " + rule); };

  ModelConfig c;
  read_required(f, source, "vocab_size", c.vocab_size);
  read_required(f, source, "hidden_size", c.hidden_size);
  read_required(f, source, "num_hidden_layers", c.num_hidden_layers);
  f.read("rms_norm_eps", c.rms_norm_eps);
  f.read("tie_word_embeddings", c.tie_word_embeddings);
  f.read("initializer_range", c.initializer_range);
  f.read("max_position_embeddings", c.max_position_embeddings);

  JsonFields linear = f.object("linear_attn_config");
  std::vector<int64_t> full_attention;
  read_required(linear, source, "full_attn_layers", full_attention);
  c.layer_types.assign(size_t(c.num_hidden_layers), LayerType::Kda);
  for (const int64_t layer : full_attention) {
    HYLA_CHECK(layer >= 1 && layer <= c.num_hidden_layers, "{}: {} holds {}, not a 1-based layer number in [1, {}]",
               source, linear.path("full_attn_layers"), layer, c.num_hidden_layers);
    c.layer_types[size_t(layer - 1)] = LayerType::Mla;
  }
  read_required(linear, source, "num_heads", c.kda.num_heads);
  read_required(linear, source, "head_dim", c.kda.head_dim);
  linear.read("short_conv_kernel_size", c.kda.conv_kernel);
  c.kda.gate = linear.has("gate_lower_bound") ? KdaGate::LowerBound : KdaGate::Softplus;
  linear.read("gate_lower_bound", c.kda.gate_lower_bound);
  bool full_rank_output_gate = false;
  linear.read("use_full_rank_gate", full_rank_output_gate);
  c.kda.gate_rank = c.kda.head_dim;
  c.kda.output_gate_rank = full_rank_output_gate ? 0 : c.kda.head_dim;

  c.mla.q_lora_rank = 0;
  c.mla.qk_rope_head_dim = 0;
  read_required(f, source, "num_attention_heads", c.mla.num_heads);
  f.read("q_lora_rank", c.mla.q_lora_rank);
  read_required(f, source, "kv_lora_rank", c.mla.kv_lora_rank);
  read_required(f, source, "qk_nope_head_dim", c.mla.qk_nope_head_dim);
  f.read("qk_rope_head_dim", c.mla.qk_rope_head_dim);
  read_required(f, source, "v_head_dim", c.mla.v_head_dim);
  f.read("rope_theta", c.mla.rope_theta);
  bool nope = false;
  f.read("mla_use_nope", nope);
  c.mla.rope = !nope;
  c.mla.output_gate = false;
  f.read("mla_use_output_gate", c.mla.output_gate);
  // The official modelling code builds q_a_layernorm and kv_a_layernorm with its RMSNorm's default
  // eps, not rms_norm_eps; no released config names it, hyla's own key does when present.
  c.mla.norm_eps = 1e-6;
  f.read("mla_norm_eps", c.mla.norm_eps);

  MoeConfig& m = c.moe;
  read_required(f, source, "num_experts", m.num_experts);
  read_required(f, source, f.has("num_experts_per_token") ? "num_experts_per_token" : "num_experts_per_tok",
                m.num_experts_per_tok);
  m.num_shared_experts = 0;
  f.read("num_shared_experts", m.num_shared_experts);
  read_required(f, source, "moe_intermediate_size", m.moe_intermediate_size);
  m.first_k_dense_replace = 0;
  f.read("first_k_dense_replace", m.first_k_dense_replace);
  f.read("intermediate_size", m.intermediate_size);
  m.routed_scaling_factor = 1.0;
  f.read("routed_scaling_factor", m.routed_scaling_factor);
  f.read("routed_expert_hidden_size", m.latent_dim);
  bool renormalize = true;
  f.read("latent_moe_use_norm", m.latent_norm);
  int64_t groups = 1, top_groups = 1, layer_freq = 1;
  f.read("num_expert_group", groups);
  f.read("topk_group", top_groups);
  if (groups > 1 || top_groups > 1)
    reject("num_expert_group", "> 1: grouped routing is not implemented (SPEC §5 routes over all experts)");
  std::string router = "sigmoid", act = "silu";
  f.read("moe_router_activation_func", router);
  if (router != "sigmoid")
    reject("moe_router_activation_func", fmt::format("is \"{}\": SPEC §5's router is a sigmoid", router));
  f.read("moe_renormalize", renormalize);
  if (!renormalize) reject("moe_renormalize", "is false: SPEC §5 renormalises the selected experts' weights");
  f.read("moe_layer_freq", layer_freq);
  if (layer_freq != 1) reject("moe_layer_freq", "must be 1 (every layer after the dense ones)");
  f.read("hidden_act", act);
  if (act == "situ") {
    m.activation = m.dense_activation = m.shared_activation = Activation::Situ;
    m.situ_linear_beta = 0.0;
    f.read("activation_situ_beta", m.situ_beta);
    f.read("activation_situ_linear_beta", m.situ_linear_beta);
    m.shared_full_width = true;
  } else if (act != "silu") {
    reject("hidden_act", fmt::format("is \"{}\": hyla reads \"silu\" (swiglu) and \"situ\"", act));
  }
  c.attn_res.enabled = f.has("attn_res_block_size");
  f.read("attn_res_block_size", c.attn_res.block_size);
  if (model_type == "kimi_k3" && root.has("vision_config")) {
    JsonFields v = root.object("vision_config");
    read_vision_config(v, source, c);
  }
  c.validate(source);
  return c;
}

}  // namespace hyla
