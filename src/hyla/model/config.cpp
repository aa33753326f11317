#include "hyla/model/config.h"

#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <utility>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

namespace hyla {
using json = nlohmann::json;

namespace {

const std::vector<LayerType> kDefaultLayerTypes = {LayerType::Kda, LayerType::Kda, LayerType::Kda, LayerType::Mla,
                                                   LayerType::Kda, LayerType::Kda, LayerType::Kda, LayerType::Mla};

template <typename E, size_t N>
E parse_enum(const std::string& text, const std::array<std::pair<E, const char*>, N>& names, const JsonFields& f,
             const std::string& key) {
  std::string allowed;
  for (const auto& [value, name] : names) {
    if (text == name) return value;
    allowed += (allowed.empty() ? "" : ", ") + std::string(name);
  }
  f.fail_rule(fmt::format("{} must be one of {}, got '{}'", f.path(key), allowed, text));
}

template <typename E, size_t N>
const char* enum_name(E value, const std::array<std::pair<E, const char*>, N>& names) {
  for (const auto& [v, name] : names)
    if (v == value) return name;
  return "?";
}

constexpr std::array<std::pair<LayerType, const char*>, 3> kLayerTypes{
    {{LayerType::Kda, "kda"}, {LayerType::Mla, "mla"}, {LayerType::Swa, "swa"}}};
constexpr std::array<std::pair<KdaGate, const char*>, 2> kGates{
    {{KdaGate::LowerBound, "lower_bound"}, {KdaGate::Softplus, "softplus"}}};
constexpr std::array<std::pair<Activation, const char*>, 2> kActivations{
    {{Activation::Swiglu, "swiglu"}, {Activation::Situ, "situ"}}};
constexpr std::array<std::pair<Balancing, const char*>, 4> kBalancing{{{Balancing::Quantile, "quantile"},
                                                                        {Balancing::BiasSign, "bias_sign"},
                                                                        {Balancing::AuxLoss, "aux_loss"},
                                                                        {Balancing::None, "none"}}};
constexpr std::array<std::pair<VisionTower, const char*>, 2> kVisionTowers{
    {{VisionTower::Patches, "patches"}, {VisionTower::MoonVit, "moonvit"}}};
constexpr std::array<std::pair<VisionNorm, const char*>, 2> kVisionNorms{
    {{VisionNorm::LayerNorm, "layernorm"}, {VisionNorm::RmsNorm, "rmsnorm"}}};
constexpr std::array<std::pair<VisionProjector, const char*>, 2> kVisionProjectors{
    {{VisionProjector::PatchMerger, "patchmerger"}, {VisionProjector::PatchMergerV2, "patchmergerv2"}}};
constexpr std::array<std::pair<Gelu, const char*>, 2> kGelus{{{Gelu::Erf, "erf"}, {Gelu::Tanh, "tanh"}}};
constexpr std::array<std::pair<GridResample, const char*>, 2> kGridResamples{
    {{GridResample::Bicubic, "bicubic"}, {GridResample::Bilinear, "bilinear"}}};

// An enum-valued key of `f` into `value`, named by `names`.
template <typename E, size_t N>
void read_enum(JsonFields& f, const char* key, E& value, const std::array<std::pair<E, const char*>, N>& names) {
  std::string text = enum_name(value, names);
  f.read(key, text);
  value = parse_enum(text, names, f, key);
}

}  // namespace

const char* to_string(LayerType t) { return enum_name(t, kLayerTypes); }
const char* to_string(KdaGate g) { return enum_name(g, kGates); }
const char* to_string(Activation a) { return enum_name(a, kActivations); }
const char* to_string(Balancing b) { return enum_name(b, kBalancing); }
const char* to_string(VisionTower t) { return enum_name(t, kVisionTowers); }
const char* to_string(VisionNorm n) { return enum_name(n, kVisionNorms); }
const char* to_string(VisionProjector p) { return enum_name(p, kVisionProjectors); }
const char* to_string(GridResample r) { return enum_name(r, kGridResamples); }

ModelConfig ModelConfig::from_json(const json& j, const std::string& source) {
  ModelConfig c;
  JsonFields f(j, source);
  for (const char* key : {"architectures", "torch_dtype", "transformers_version", "_name_or_path"}) f.ignore(key);
  std::string model_type;
  f.read("model_type", model_type);
  if (model_type != "hyla")
    f.fail_rule(f.has("model_type") ? fmt::format("model_type must be \"hyla\", got \"{}\"", model_type)
                                    : "model_type is required and must be \"hyla\"");
  f.read("architecture", c.architecture);
  f.read("vocab_size", c.vocab_size);
  f.read("hidden_size", c.hidden_size);
  f.read("num_hidden_layers", c.num_hidden_layers);
  std::vector<std::string> types;
  f.read("layer_types", types);
  if (f.has("layer_types")) {
    for (const std::string& t : types) c.layer_types.push_back(parse_enum(t, kLayerTypes, f, "layer_types"));
  } else {
    if (c.num_hidden_layers != int64_t(kDefaultLayerTypes.size()))
      f.fail_rule(fmt::format("layer_types is required when num_hidden_layers ({}) is not {}", c.num_hidden_layers,
                              kDefaultLayerTypes.size()));
    c.layer_types = kDefaultLayerTypes;
  }
  f.read("rms_norm_eps", c.rms_norm_eps);
  f.read("tie_word_embeddings", c.tie_word_embeddings);
  f.read("initializer_range", c.initializer_range);
  f.read("max_position_embeddings", c.max_position_embeddings);

  JsonFields kda = f.object("kda");
  kda.read("num_heads", c.kda.num_heads);
  kda.read("head_dim", c.kda.head_dim);
  kda.read("conv_kernel", c.kda.conv_kernel);
  std::string gate = to_string(c.kda.gate);
  kda.read("gate", gate);
  c.kda.gate = parse_enum(gate, kGates, kda, "gate");
  kda.read("gate_lower_bound", c.kda.gate_lower_bound);
  kda.read("chunk_size", c.kda.chunk_size);
  kda.read("gate_rank", c.kda.gate_rank);
  kda.read("output_gate_rank", c.kda.output_gate_rank);
  kda.finish();

  JsonFields mla = f.object("mla");
  mla.read("num_heads", c.mla.num_heads);
  mla.read("q_lora_rank", c.mla.q_lora_rank);
  mla.read("kv_lora_rank", c.mla.kv_lora_rank);
  mla.read("qk_nope_head_dim", c.mla.qk_nope_head_dim);
  mla.read("qk_rope_head_dim", c.mla.qk_rope_head_dim);
  mla.read("v_head_dim", c.mla.v_head_dim);
  mla.read("rope_theta", c.mla.rope_theta);
  mla.read("output_gate", c.mla.output_gate);
  mla.read("output_gate_per_head", c.mla.output_gate_per_head);
  mla.read("sliding_window", c.mla.sliding_window);
  mla.read("rope", c.mla.rope);
  c.mla.norm_eps = c.rms_norm_eps;
  mla.read("norm_eps", c.mla.norm_eps);
  mla.finish();

  JsonFields moe = f.object("moe");
  moe.read("num_experts", c.moe.num_experts);
  moe.read("num_experts_per_tok", c.moe.num_experts_per_tok);
  moe.read("num_shared_experts", c.moe.num_shared_experts);
  moe.read("moe_intermediate_size", c.moe.moe_intermediate_size);
  moe.read("shared_intermediate_size", c.moe.shared_intermediate_size);
  moe.read("first_k_dense_replace", c.moe.first_k_dense_replace);
  moe.read("intermediate_size", c.moe.intermediate_size);
  moe.read("router_latent_dim", c.moe.router_latent_dim);
  moe.read("latent_dim", c.moe.latent_dim);
  moe.read("routed_scaling_factor", c.moe.routed_scaling_factor);
  auto read_activation = [&](const char* key, Activation& value) {
    std::string name = to_string(value);
    moe.read(key, name);
    value = parse_enum(name, kActivations, moe, key);
  };
  read_activation("activation", c.moe.activation);
  read_activation("dense_activation", c.moe.dense_activation);
  read_activation("shared_activation", c.moe.shared_activation);
  moe.read("situ_beta", c.moe.situ_beta);
  moe.read("situ_linear_beta", c.moe.situ_linear_beta);
  moe.read("swiglu_limit", c.moe.swiglu_limit);
  moe.read("shared_swiglu_limit", c.moe.shared_swiglu_limit);
  moe.read("shared_full_width", c.moe.shared_full_width);
  moe.read("latent_norm", c.moe.latent_norm);
  std::string balancing = to_string(c.moe.balancing);
  moe.read("balancing", balancing);
  c.moe.balancing = parse_enum(balancing, kBalancing, moe, "balancing");
  moe.read("bias_update_speed", c.moe.bias_update_speed);
  moe.read("aux_loss_coef", c.moe.aux_loss_coef);
  moe.finish();

  JsonFields attn_res = f.object("attn_res");
  attn_res.read("enabled", c.attn_res.enabled);
  attn_res.read("block_size", c.attn_res.block_size);
  attn_res.finish();

  JsonFields vision = f.object("vision");
  vision.read("enabled", c.vision.enabled);
  read_enum(vision, "tower", c.vision.tower, kVisionTowers);
  vision.read("patch_size", c.vision.patch_size);
  vision.read("channels", c.vision.channels);
  vision.read("max_grid", c.vision.max_grid);
  if (vision.has("moonvit")) {
    MoonVitConfig& m = c.vision.moonvit;
    JsonFields t = vision.object("moonvit");
    t.read("hidden_size", m.hidden_size);
    t.read("num_heads", m.num_heads);
    t.read("head_dim", m.head_dim);
    t.read("num_layers", m.num_layers);
    t.read("intermediate_size", m.intermediate_size);
    t.read("pos_emb_height", m.pos_emb_height);
    t.read("pos_emb_width", m.pos_emb_width);
    read_enum(t, "pos_emb_resample", m.pos_emb_resample, kGridResamples);
    read_enum(t, "norm", m.norm, kVisionNorms);
    t.read("norm_eps", m.norm_eps);
    t.read("bias", m.bias);
    t.read("rope_theta", m.rope_theta);
    t.read("merge", m.merge);
    read_enum(t, "projector", m.projector, kVisionProjectors);
    t.read("projector_eps", m.projector_eps);
    read_enum(t, "projector_gelu", m.projector_gelu, kGelus);
    t.read("in_patch_limit", m.in_patch_limit);
    t.read("patch_limit_on_one_side", m.patch_limit_on_one_side);
    t.read("image_mean", m.image_mean);
    t.read("image_std", m.image_std);
    t.finish();
  }
  vision.finish();

  f.finish();
  c.validate(source);
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  auto rule = [&](bool ok, const std::string& message) { HYLA_CHECK(ok, "{}: {}", source, message); };
  auto positive = [&](int64_t v, const char* key) { rule(v > 0, fmt::format("{} ({}) must be > 0", key, v)); };
  auto non_negative = [&](int64_t v, const char* key) { rule(v >= 0, fmt::format("{} ({}) must be >= 0", key, v)); };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  rule(int64_t(layer_types.size()) == num_hidden_layers,
       fmt::format("layer_types has {} entries but num_hidden_layers is {}", layer_types.size(), num_hidden_layers));
  // Every real-valued option finite as the f32 the kernels compute with: an inf or NaN from a file,
  // or a double past f32's range (1e308), would reach the logits as NaN.
  for (const auto& [value, key] :
       {std::pair{rms_norm_eps, "rms_norm_eps"}, {initializer_range, "initializer_range"},
        {kda.gate_lower_bound, "kda.gate_lower_bound"}, {mla.rope_theta, "mla.rope_theta"},
        {mla.norm_eps, "mla.norm_eps"},
        {moe.routed_scaling_factor, "moe.routed_scaling_factor"}, {moe.situ_beta, "moe.situ_beta"},
        {moe.situ_linear_beta, "moe.situ_linear_beta"}, {moe.bias_update_speed, "moe.bias_update_speed"},
        {moe.aux_loss_coef, "moe.aux_loss_coef"}, {moe.swiglu_limit, "moe.swiglu_limit"},
        {moe.shared_swiglu_limit, "moe.shared_swiglu_limit"}})
    rule(std::isfinite(value) && std::abs(value) <= std::numeric_limits<float>::max(),
         fmt::format("{} ({}) must be finite{}", key, value, std::isfinite(value) ? " as the f32 it is computed in" : ""));
  rule(rms_norm_eps > 0 && rms_norm_eps < 1, fmt::format("rms_norm_eps ({}) must lie in (0, 1)", rms_norm_eps));
  rule(initializer_range > 0, fmt::format("initializer_range ({}) must be > 0", initializer_range));
  positive(max_position_embeddings, "max_position_embeddings");

  positive(kda.num_heads, "kda.num_heads");
  positive(kda.head_dim, "kda.head_dim");
  positive(kda.conv_kernel, "kda.conv_kernel");
  if (kda.gate == KdaGate::LowerBound)
    rule(kda.gate_lower_bound >= -5.0 && kda.gate_lower_bound < 0.0,
         fmt::format("kda.gate_lower_bound ({}) must lie in [-5, 0) for the lower_bound gate", kda.gate_lower_bound));
  non_negative(kda.gate_rank, "kda.gate_rank");
  non_negative(kda.output_gate_rank, "kda.output_gate_rank");
  rule(kda.chunk_size > 0 && kda.chunk_size % 16 == 0 && kda.chunk_size <= 256,
       fmt::format("kda.chunk_size ({}) must be a multiple of 16 (the sub-chunk) between 16 and 256", kda.chunk_size));

  positive(mla.num_heads, "mla.num_heads");
  non_negative(mla.q_lora_rank, "mla.q_lora_rank");
  positive(mla.kv_lora_rank, "mla.kv_lora_rank");
  non_negative(mla.qk_nope_head_dim, "mla.qk_nope_head_dim");
  non_negative(mla.qk_rope_head_dim, "mla.qk_rope_head_dim");
  rule(mla.qk_rope_head_dim % 2 == 0, fmt::format("mla.qk_rope_head_dim ({}) must be even (RoPE rotates pairs)",
                                                  mla.qk_rope_head_dim));
  rule(mla.qk_nope_head_dim + mla.qk_rope_head_dim > 0, "mla.qk_nope_head_dim + mla.qk_rope_head_dim must be > 0");
  positive(mla.v_head_dim, "mla.v_head_dim");
  rule(mla.rope_theta > 0, fmt::format("mla.rope_theta ({}) must be > 0", mla.rope_theta));
  rule(mla.norm_eps > 0 && mla.norm_eps < 1, fmt::format("mla.norm_eps ({}) must lie in (0, 1)", mla.norm_eps));
  non_negative(mla.sliding_window, "mla.sliding_window");
  for (size_t l = 0; l < layer_types.size(); ++l)
    rule(layer_types[l] != LayerType::Swa || mla.sliding_window > 0,
         fmt::format("layer_types[{}] is \"swa\" but mla.sliding_window is 0", l));

  positive(moe.num_experts, "moe.num_experts");
  positive(moe.num_experts_per_tok, "moe.num_experts_per_tok");
  rule(moe.num_experts_per_tok <= moe.num_experts,
       fmt::format("moe.num_experts_per_tok ({}) > moe.num_experts ({})", moe.num_experts_per_tok, moe.num_experts));
  if (moe.balancing == Balancing::Quantile)
    rule(moe.num_experts_per_tok < moe.num_experts,
         fmt::format("moe.num_experts_per_tok ({}) must be < moe.num_experts ({}) for quantile balancing",
                     moe.num_experts_per_tok, moe.num_experts));
  non_negative(moe.num_shared_experts, "moe.num_shared_experts");
  positive(moe.moe_intermediate_size, "moe.moe_intermediate_size");
  non_negative(moe.shared_intermediate_size, "moe.shared_intermediate_size");
  rule(moe.first_k_dense_replace >= 0 && moe.first_k_dense_replace <= num_hidden_layers,
       fmt::format("moe.first_k_dense_replace ({}) must lie in [0, num_hidden_layers = {}]", moe.first_k_dense_replace,
                   num_hidden_layers));
  if (moe.first_k_dense_replace > 0) positive(moe.intermediate_size, "moe.intermediate_size");
  non_negative(moe.router_latent_dim, "moe.router_latent_dim");
  non_negative(moe.latent_dim, "moe.latent_dim");
  // Its product with an expert's output is squared in the next norm: past 1e6 that leaves f32.
  rule(moe.routed_scaling_factor > 0 && moe.routed_scaling_factor <= 1e6,
       fmt::format("moe.routed_scaling_factor ({}) must lie in (0, 1e6]", moe.routed_scaling_factor));
  rule(moe.bias_update_speed >= 0, fmt::format("moe.bias_update_speed ({}) must be >= 0", moe.bias_update_speed));
  rule(moe.situ_beta > 0, fmt::format("moe.situ_beta ({}) must be > 0", moe.situ_beta));
  rule(moe.aux_loss_coef >= 0, fmt::format("moe.aux_loss_coef ({}) must be >= 0", moe.aux_loss_coef));
  rule(moe.swiglu_limit >= 0 && moe.shared_swiglu_limit >= 0, "moe.swiglu_limit and shared_swiglu_limit must be >= 0");
  rule(moe.swiglu_limit == 0 || moe.activation == Activation::Swiglu,
       "moe.swiglu_limit clamps SwiGLU; moe.activation is not swiglu");
  rule(moe.shared_swiglu_limit == 0 || moe.shared_activation == Activation::Swiglu,
       "moe.shared_swiglu_limit clamps SwiGLU; moe.shared_activation is not swiglu");
  rule(!mla.output_gate_per_head || mla.output_gate, "mla.output_gate_per_head needs mla.output_gate");

  positive(attn_res.block_size, "attn_res.block_size");
  positive(vision.patch_size, "vision.patch_size");
  positive(vision.channels, "vision.channels");
  positive(vision.max_grid, "vision.max_grid");
  if (vision.tower == VisionTower::MoonVit) {
    const MoonVitConfig& m = vision.moonvit;
    rule(vision.channels == 3, fmt::format("vision.channels ({}) must be 3 for the moonvit tower", vision.channels));
    for (const auto& [value, name] :
         {std::pair{m.hidden_size, "hidden_size"}, {m.num_heads, "num_heads"}, {m.head_dim, "head_dim"},
          {m.num_layers, "num_layers"}, {m.intermediate_size, "intermediate_size"}, {m.pos_emb_height, "pos_emb_height"},
          {m.pos_emb_width, "pos_emb_width"}, {m.merge, "merge"}, {m.in_patch_limit, "in_patch_limit"},
          {m.patch_limit_on_one_side, "patch_limit_on_one_side"}})
      rule(value > 0, fmt::format("vision.moonvit.{} ({}) must be > 0", name, value));
    rule(m.head_dim % 4 == 0,
         fmt::format("vision.moonvit.head_dim ({}) must be a multiple of 4 (2-D rotary pairs)", m.head_dim));
    rule(m.norm_eps > 0 && m.projector_eps > 0, "vision.moonvit.norm_eps and projector_eps must be > 0");
    rule(m.rope_theta > 1, fmt::format("vision.moonvit.rope_theta ({}) must be > 1", m.rope_theta));
    rule(m.image_mean.size() == 3 && m.image_std.size() == 3,
         "vision.moonvit.image_mean and image_std need one value per channel (3)");
    for (double sd : m.image_std) rule(sd > 0, fmt::format("vision.moonvit.image_std ({}) must be > 0", sd));
  }
}

json ModelConfig::to_json() const {
  json types = json::array();
  for (LayerType t : layer_types) types.push_back(to_string(t));
  return {
      {"model_type", "hyla"},
      {"architecture", architecture},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"num_hidden_layers", num_hidden_layers},
      {"layer_types", types},
      {"rms_norm_eps", rms_norm_eps},
      {"tie_word_embeddings", tie_word_embeddings},
      {"initializer_range", initializer_range},
      {"max_position_embeddings", max_position_embeddings},
      {"kda",
       {{"num_heads", kda.num_heads}, {"head_dim", kda.head_dim}, {"conv_kernel", kda.conv_kernel},
        {"gate", to_string(kda.gate)}, {"gate_lower_bound", kda.gate_lower_bound}, {"chunk_size", kda.chunk_size},
        {"gate_rank", kda.gate_rank}, {"output_gate_rank", kda.output_gate_rank}}},
      {"mla",
       {{"num_heads", mla.num_heads}, {"q_lora_rank", mla.q_lora_rank}, {"kv_lora_rank", mla.kv_lora_rank},
        {"qk_nope_head_dim", mla.qk_nope_head_dim}, {"qk_rope_head_dim", mla.qk_rope_head_dim},
        {"v_head_dim", mla.v_head_dim}, {"rope_theta", mla.rope_theta}, {"output_gate", mla.output_gate},
        {"output_gate_per_head", mla.output_gate_per_head},
        {"sliding_window", mla.sliding_window}, {"rope", mla.rope}, {"norm_eps", mla.norm_eps}}},
      {"moe",
       {{"num_experts", moe.num_experts}, {"num_experts_per_tok", moe.num_experts_per_tok},
        {"num_shared_experts", moe.num_shared_experts}, {"moe_intermediate_size", moe.moe_intermediate_size},
        {"shared_intermediate_size", moe.shared_intermediate_size},
        {"first_k_dense_replace", moe.first_k_dense_replace}, {"intermediate_size", moe.intermediate_size},
        {"router_latent_dim", moe.router_latent_dim}, {"latent_dim", moe.latent_dim},
        {"routed_scaling_factor", moe.routed_scaling_factor}, {"activation", to_string(moe.activation)},
        {"dense_activation", to_string(moe.dense_activation)}, {"shared_activation", to_string(moe.shared_activation)},
        {"situ_beta", moe.situ_beta}, {"situ_linear_beta", moe.situ_linear_beta},
        {"swiglu_limit", moe.swiglu_limit}, {"shared_swiglu_limit", moe.shared_swiglu_limit},
        {"shared_full_width", moe.shared_full_width}, {"latent_norm", moe.latent_norm},
        {"balancing", to_string(moe.balancing)}, {"bias_update_speed", moe.bias_update_speed},
        {"aux_loss_coef", moe.aux_loss_coef}}},
      {"attn_res", {{"enabled", attn_res.enabled}, {"block_size", attn_res.block_size}}},
      {"vision", vision_json()},
  };
}

json ModelConfig::vision_json() const {
  json v = {{"enabled", vision.enabled}, {"tower", to_string(vision.tower)}, {"patch_size", vision.patch_size},
            {"channels", vision.channels}, {"max_grid", vision.max_grid}};
  if (vision.tower != VisionTower::MoonVit) return v;
  const MoonVitConfig& m = vision.moonvit;
  v["moonvit"] = {{"hidden_size", m.hidden_size}, {"num_heads", m.num_heads}, {"head_dim", m.head_dim},
                  {"num_layers", m.num_layers}, {"intermediate_size", m.intermediate_size},
                  {"pos_emb_height", m.pos_emb_height}, {"pos_emb_width", m.pos_emb_width},
                  {"pos_emb_resample", to_string(m.pos_emb_resample)}, {"norm", to_string(m.norm)},
                  {"norm_eps", m.norm_eps}, {"bias", m.bias}, {"rope_theta", m.rope_theta}, {"merge", m.merge},
                  {"projector", to_string(m.projector)}, {"projector_eps", m.projector_eps},
                  {"projector_gelu", enum_name(m.projector_gelu, kGelus)},
                  {"in_patch_limit", m.in_patch_limit}, {"patch_limit_on_one_side", m.patch_limit_on_one_side},
                  {"image_mean", m.image_mean}, {"image_std", m.image_std}};
  return v;
}

}  // namespace hyla
