#include "hyla/model/arch/kimi_family.h"

#include <algorithm>
#include <charconv>

#include "hyla/core/error.h"
#include "hyla/model/arch/gguf_blocks.h"

namespace hyla {
namespace {

using json = nlohmann::json;

// hyla's own key for the MLA latent norms' eps (llama.cpp has none: it uses layer_norm_rms_epsilon).
constexpr const char* kLatentNormEps = "attention.latent_norm_rms_epsilon";

template <typename T>
void read_required(JsonFields& f, const std::string& source, const char* key, T& out) {
  HYLA_CHECK(f.has(key), "{}: {} is required", source, f.path(key));
  f.read(key, out);
}

bool strip(std::string& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.erase(0, prefix.size());
  return true;
}

bool replace_suffix(std::string& s, std::string_view from, std::string_view to) {
  if (!s.ends_with(from)) return false;
  s.replace(s.size() - from.size(), from.size(), to);
  return true;
}

}  // namespace

void check_kimi(const ModelConfig& c, const Requirement& require) {
  bool kda = false, mla = false;
  for (LayerType t : c.layer_types) {
    require(t != LayerType::Swa, "llama.cpp has no sliding-window (\"swa\") layers");
    kda |= t == LayerType::Kda, mla |= t == LayerType::Mla;
  }
  require(!kda || !mla || c.kda.num_heads == c.mla.num_heads,
          "llama.cpp has one head count for KDA and MLA layers (kda.num_heads must equal mla.num_heads)");
  require(c.kda.gate_rank == c.kda.head_dim, "llama.cpp's decay gate is f_b(f_a u) with rank kda.head_dim (kda.gate_rank)");
  require(!mla || !c.mla.rope || c.mla.qk_rope_head_dim == 0, "llama.cpp never rotates q_pe/k_pe (mla.rope must be false)");
  require(c.mla.sliding_window == 0, "mla.sliding_window must be 0");
  // MoonViT stays out of the text GGUF (as llama.cpp's converter leaves it out); hyla's own patch
  // embedding has no llama.cpp graph at all.
  require(!c.vision.enabled || c.vision.tower == VisionTower::MoonVit,
          "llama.cpp's graphs read no images through hyla's patch embedding (vision.enabled)");
  require(c.moe.router_latent_dim == 0, "llama.cpp's router is σ(W_r u) (moe.router_latent_dim must be 0)");
  require(c.moe.num_experts <= 1024, "llama.cpp allows at most 1024 experts");
}

json without_nulls(const json& j) {
  if (!j.is_object()) return j;
  json out = json::object();
  for (const auto& [key, value] : j.items())
    if (!value.is_null()) out[key] = without_nulls(value);
  return out;
}

ModelConfig kimi_text_config(JsonFields& f, const std::string& source) {
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
  return c;
}

std::optional<HfTensor> kimi_hf_tensor(const std::string& checkpoint_name, const ModelConfig& c,
                                       const std::string& source) {
  std::string name = checkpoint_name;
  strip(name, "language_model.");
  if (name.starts_with("vision_tower.") || name.starts_with("mm_projector.")) {
    if (!c.vision.enabled || c.vision.tower != VisionTower::MoonVit) return std::nullopt;
    // MoonViT keeps the checkpoint's names (SPEC §7.2); its patch convolution is held as a matrix.
    if (name == "vision_tower.patch_embed.proj.weight") {
      const int64_t P = c.vision.patch_size;
      return HfTensor{name, Shape{c.vision.moonvit.hidden_size, c.vision.channels * P * P}};
    }
    return HfTensor{name};
  }
  const int64_t d = c.hidden_size;
  if (name.ends_with("output_attn_res_proj.weight")) return HfTensor{"model.out_res_query", Shape{d}};
  if (name.ends_with("output_attn_res_norm.weight")) return HfTensor{"model.out_res_norm.weight"};
  std::string rest = name;
  if (!strip(rest, "model.layers.")) return HfTensor{name};
  int64_t layer = -1;
  const auto dot = rest.find('.');
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + dot, layer);
  HYLA_CHECK(error == std::errc() && end == rest.data() + dot && layer >= 0 && layer < c.num_hidden_layers,
             "{}: tensor '{}' names layer '{}', outside the config's {} layers", source, name, rest.substr(0, dot),
             c.num_hidden_layers);
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  std::string t = rest.substr(dot + 1);
  if (t == "self_attention_res_proj.weight") return HfTensor{p + "attn_res_query", Shape{d}};
  if (t == "self_attention_res_norm.weight") return HfTensor{p + "attn_res_norm.weight"};
  if (t == "mlp_res_proj.weight") return HfTensor{p + "mlp_res_query", Shape{d}};
  if (t == "mlp_res_norm.weight") return HfTensor{p + "mlp_res_norm.weight"};
  if (t == "self_attn.A_log") return HfTensor{p + t, Shape{c.kda.num_heads}, true};
  if (t == "self_attn.q_conv1d.weight" || t == "self_attn.k_conv1d.weight" || t == "self_attn.v_conv1d.weight")
    return HfTensor{p + t, Shape{c.kda.num_heads * c.kda.head_dim, 1, c.kda.conv_kernel}};
  if (strip(t, "block_sparse_moe.")) {
    if (t == "gate.e_score_correction_bias" || t == "gate.weight" || t.starts_with("shared_experts."))
      return HfTensor{p + "mlp." + t};
    if (t == "routed_expert_down_proj.weight") return HfTensor{p + "mlp.lat_down.weight"};
    if (t == "routed_expert_up_proj.weight") return HfTensor{p + "mlp.lat_up.weight"};
    if (t == "routed_expert_norm.weight") return HfTensor{p + "mlp.lat_norm.weight"};
    if (t.starts_with("experts.")) {
      // compressed-tensors MXFP4 ("mxfp4-pack-quantized") experts are hyla's MXFP4 format as they
      // are: weight_packed the codes, weight_scale the E8M0 scales (mxfp4_weights.h).
      for (auto [from, to] : {std::pair{".w1.weight", ".gate_proj.weight"}, std::pair{".w2.weight", ".down_proj.weight"},
                              std::pair{".w3.weight", ".up_proj.weight"}, std::pair{".w1.weight_packed", ".gate_proj.weight"},
                              std::pair{".w2.weight_packed", ".down_proj.weight"}, std::pair{".w3.weight_packed", ".up_proj.weight"},
                              std::pair{".w1.weight_scale", ".gate_proj.weight.scale"},
                              std::pair{".w2.weight_scale", ".down_proj.weight.scale"},
                              std::pair{".w3.weight_scale", ".up_proj.weight.scale"}})
        if (replace_suffix(t, from, to)) return HfTensor{p + "mlp." + t};
    }
    fail("{}: tensor '{}' is not part of a Kimi MoE block hyla reads", source, name);
  }
  return HfTensor{p + t};
}

ModelConfig read_kimi_gguf(const GgufKeys& keys) {
  const GgufFile& g = keys.file();
  const std::string source = keys.source();
  ModelConfig c;
  c.hidden_size = keys.integer("embedding_length");
  c.num_hidden_layers = keys.integer("block_count");
  // Checked against the tensors before anything is sized from it: every layer has its attn_norm.
  const int64_t layers_held = std::count_if(g.tensors().begin(), g.tensors().end(), [](const GgufTensor& t) {
    return t.name.starts_with("blk.") && t.name.ends_with(".attn_norm.weight");
  });
  HYLA_CHECK(c.num_hidden_layers >= 1 && c.num_hidden_layers == layers_held,
             "{}: {} is {} but the file holds {} layers' tensors (blk.N.attn_norm.weight)", source,
             keys.key("block_count"), c.num_hidden_layers, layers_held);
  c.max_position_embeddings = keys.integer("context_length");
  c.rms_norm_eps = keys.number("attention.layer_norm_rms_epsilon");
  c.vocab_size = g.tensor("token_embd.weight").ne.at(1);
  HYLA_CHECK(!keys.has("vocab_size") || keys.integer("vocab_size") == c.vocab_size,
             "{}: {} = {} but token_embd.weight has {} rows", source, keys.key("vocab_size"),
             keys.integer("vocab_size"), c.vocab_size);
  c.tie_word_embeddings = false;
  const std::vector<int64_t> kv_heads = keys.integers("attention.head_count_kv");
  HYLA_CHECK(int64_t(kv_heads.size()) == c.num_hidden_layers, "{}: {} lists {} layers, block_count is {}", source,
             keys.key("attention.head_count_kv"), kv_heads.size(), c.num_hidden_layers);
  c.layer_types.clear();
  for (int64_t h : kv_heads) c.layer_types.push_back(h == 0 ? LayerType::Kda : LayerType::Mla);
  const int64_t heads = keys.uniform("attention.head_count");

  KdaConfig& kda = c.kda;
  kda.num_heads = heads;
  kda.head_dim = keys.integer("kda.head_dim");
  kda.conv_kernel = keys.integer("ssm.conv_kernel");
  kda.chunk_size = KdaConfig{}.chunk_size;
  if (keys.has("kda.gate_lower_bound")) {
    kda.gate = KdaGate::LowerBound;
    kda.gate_lower_bound = keys.number("kda.gate_lower_bound");
  } else {
    kda.gate = KdaGate::Softplus;
  }
  kda.gate_rank = kda.head_dim;

  MlaConfig& mla = c.mla;
  mla.num_heads = heads;
  mla.q_lora_rank = 0;
  mla.kv_lora_rank = keys.integer("attention.kv_lora_rank");
  const int64_t key_length = keys.integer("attention.key_length_mla");
  mla.v_head_dim = keys.integer("attention.value_length_mla");
  mla.rope = false;
  mla.output_gate = false;
  mla.qk_rope_head_dim = keys.integer_or("rope.dimension_count", 0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_attention_layer(l)) {  // the tensor's width is what the graph uses
      mla.qk_rope_head_dim = g.tensor(fmt::format("blk.{}.attn_kv_a_mqa.weight", l)).ne.at(1) - mla.kv_lora_rank;
      break;
    }
  mla.qk_nope_head_dim = key_length - mla.qk_rope_head_dim;
  HYLA_CHECK(mla.qk_nope_head_dim >= 0, "{}: attention.key_length_mla {} is less than the rope width {}", source,
             key_length, mla.qk_rope_head_dim);
  if (keys.has("rope.freq_base")) mla.rope_theta = keys.number("rope.freq_base");
  // llama.cpp's graph uses layer_norm_rms_epsilon for the latent norms too; hyla's key (written
  // only where the two differ) says when the model was made with another.
  mla.norm_eps = keys.has(kLatentNormEps) ? keys.number(kLatentNormEps) : c.rms_norm_eps;
  mla.sliding_window = 0;

  read_gguf_moe(keys, c);
  MoeConfig& moe = c.moe;
  moe.latent_dim = 0;
  moe.activation = moe.dense_activation = moe.shared_activation = Activation::Swiglu;
  moe.shared_full_width = false;
  moe.latent_norm = true;
  c.attn_res.enabled = false;
  c.attn_res.block_size = AttnResConfig{}.block_size;
  c.vision.enabled = false;
  return c;
}

void write_kimi_gguf(const ModelConfig& c, GgufKeyWriter& keys) {
  write_gguf_trunk(c, keys);
  if (c.mla.norm_eps != c.rms_norm_eps) keys.f32(kLatentNormEps, c.mla.norm_eps);
  write_gguf_moe(c, keys);
}

std::vector<GgufTensorMap> kimi_gguf_tensors(const ModelConfig& cfg, const std::vector<int64_t>& a_log_ne) {
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size;
  const KdaConfig& k = cfg.kda;
  const MoeConfig& moe = cfg.moe;
  const int64_t HK = k.num_heads * k.head_dim;
  const int64_t expert_in = moe.latent_dim > 0 ? moe.latent_dim : d;
  const int64_t shared_in = moe.latent_dim > 0 && !moe.shared_full_width ? moe.latent_dim : d;
  GgufTable t;
  t.add("token_embd.weight", {d, V}, GgufLink::Same, {"model.embed_tokens.weight"}, true);
  t.add("output_norm.weight", {d}, GgufLink::Same, {"model.norm.weight"}, false);
  t.add("output.weight", {d, V}, GgufLink::Same, {cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"},
        true);
  if (cfg.attn_res.enabled)
    t.add("output_res_score.weight", {d}, GgufLink::Score, {"model.out_res_query", "model.out_res_norm.weight"}, false);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l), p = fmt::format("model.layers.{}.", l);
    const std::string a = p + "self_attn.", f = p + "mlp.";
    t.add(b + "attn_norm.weight", {d}, GgufLink::Same, {p + "input_layernorm.weight"}, false);
    t.add(b + "ffn_norm.weight", {d}, GgufLink::Same, {p + "post_attention_layernorm.weight"}, false);
    if (cfg.attn_res.enabled) {
      t.add(b + "attn_res_score.weight", {d}, GgufLink::Score, {p + "attn_res_query", p + "attn_res_norm.weight"}, false);
      t.add(b + "ffn_res_score.weight", {d}, GgufLink::Score, {p + "mlp_res_query", p + "mlp_res_norm.weight"}, false);
    }
    if (!cfg.is_attention_layer(l)) {
      add_gguf_kda_qkv(t, cfg, b, a);
      t.add(b + "ssm_f_a.weight", {d, k.gate_rank}, GgufLink::Same, {a + "f_a_proj.weight"}, true);
      t.add(b + "ssm_f_b.weight", {k.gate_rank, HK}, GgufLink::Same, {a + "f_b_proj.weight"}, true);
      t.add(b + "ssm_beta.weight", {d, k.num_heads}, GgufLink::Same, {a + "b_proj.weight"}, true);
      t.add(b + "ssm_a", a_log_ne, GgufLink::NegExp, {a + "A_log"}, false);
      t.add(b + "ssm_dt.bias", {HK}, GgufLink::Same, {a + "dt_bias"}, false);
      if (k.output_gate_rank == 0) {
        t.add(b + "ssm_g.weight", {d, HK}, GgufLink::Same, {a + "g_proj.weight"}, true);
      } else {
        t.add(b + "ssm_g_a.weight", {d, k.output_gate_rank}, GgufLink::Same, {a + "g_a_proj.weight"}, true);
        t.add(b + "ssm_g_b.weight", {k.output_gate_rank, HK}, GgufLink::Same, {a + "g_b_proj.weight"}, true);
      }
      t.add(b + "ssm_norm.weight", {k.head_dim}, GgufLink::Same, {a + "o_norm.weight"}, false);
      t.add(b + "attn_output.weight", {HK, d}, GgufLink::Same, {a + "o_proj.weight"}, true);
    } else {
      add_gguf_mla(t, cfg, b, a);
    }
    add_gguf_ffn(t, cfg, l, b, f, expert_in);
    if (!cfg.is_moe_layer(l)) continue;
    if (moe.latent_dim > 0) {
      t.add(b + "ffn_routed_down.weight", {d, moe.latent_dim}, GgufLink::Same, {f + "lat_down.weight"}, true);
      if (moe.latent_norm)
        t.add(b + "ffn_routed_norm.weight", {moe.latent_dim}, GgufLink::Same, {f + "lat_norm.weight"}, false);
      t.add(b + "ffn_routed_up.weight", {moe.latent_dim, d}, GgufLink::Same, {f + "lat_up.weight"}, true);
    }
    if (moe.num_shared_experts > 0) add_gguf_shared_experts(t, cfg, b, f, shared_in);
  }
  return t.maps;
}

}  // namespace hyla
