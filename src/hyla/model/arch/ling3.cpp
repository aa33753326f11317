// Ling 3.0 (inclusionAI; 7.9B-A1.3B and 124B-A5.1B): KDA with the bounded decay gate and full-rank
// decay and output gates, MLA with RoPE on q_pe and k_pe (adjacent pairs, SPEC §4) and one sigmoid
// output gate per head, a sigmoid-routed MoE with the correction bias, shared experts of their own
// width and SwiGLU clamped (SPEC §5), no attention residuals. Every `layer_group_size`-th layer (and
// the ones after the last whole group) is MLA, the rest KDA. Multi-token-prediction layers, past
// num_hidden_layers, are read and skipped. Hugging Face: model_type "bailing_moe_v3"
// (BailingMoeV3ForCausalLM); llama.cpp: "bailingmoe3".
#include <algorithm>
#include <charconv>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"
#include "hyla/model/arch/architecture.h"
#include "hyla/model/arch/gguf_blocks.h"
#include "hyla/model/arch/kimi_family.h"  // without_nulls

namespace hyla {
namespace {

using json = nlohmann::json;

void check(const ModelConfig& c, const Requirement& require) {
  bool kda = false, mla = false;
  for (LayerType t : c.layer_types) {
    require(t != LayerType::Swa, "ling3 has no sliding-window (\"swa\") layers");
    kda |= t == LayerType::Kda, mla |= t == LayerType::Mla;
  }
  require(!kda || !mla || c.kda.num_heads == c.mla.num_heads,
          "ling3 has one head count for KDA and MLA layers (kda.num_heads must equal mla.num_heads)");
  require(c.kda.gate == KdaGate::LowerBound, "ling3's decay gate is the bounded one (kda.gate lower_bound)");
  require(c.kda.gate_rank == 0 && c.kda.output_gate_rank == 0,
          "ling3's KDA gates are full rank (kda.gate_rank and kda.output_gate_rank must be 0)");
  require(c.mla.output_gate && c.mla.output_gate_per_head,
          "ling3's MLA has one output gate per head (mla.output_gate and output_gate_per_head)");
  require(c.mla.rope || c.mla.qk_rope_head_dim == 0, "ling3 rotates q_pe and k_pe (mla.rope)");
  require(c.mla.sliding_window == 0, "mla.sliding_window must be 0");
  require(c.mla.norm_eps == c.rms_norm_eps, "ling3's latent norms take rms_norm_eps (mla.norm_eps must equal it)");
  const MoeConfig& moe = c.moe;
  require(moe.activation == Activation::Swiglu && moe.dense_activation == Activation::Swiglu &&
              moe.shared_activation == Activation::Swiglu,
          "ling3 uses SwiGLU in every FFN");
  require(moe.latent_dim == 0 && moe.router_latent_dim == 0, "ling3's experts and router read u at full width");
  require(!c.attn_res.enabled, "ling3 has no attention residuals (attn_res.enabled must be false)");
  require(!c.vision.enabled, "ling3 reads no images (vision.enabled must be false)");
}

template <typename T>
void read_required(JsonFields& f, const std::string& source, const char* key, T& out) {
  HYLA_CHECK(f.has(key), "{}: {} is required", source, f.path(key));
  f.read(key, out);
}

// A per-layer clamp list (null entries: none) as one value: SPEC has one limit for the routed and
// one for the shared experts. `moe_layers` take it; the dense layers must have none, because
// llama.cpp clamps a dense layer's FFN by the shared experts' value there.
double one_limit(JsonFields& f, const char* key, const ModelConfig& c) {
  if (!f.has(key)) return 0.0;
  const json& list = f.raw(key);
  if (!list.is_array()) f.fail_rule(f.path(key) + " is not a list");
  double limit = -1;
  for (int64_t l = 0; l < c.num_hidden_layers && l < int64_t(list.size()); ++l) {
    const json& v = list[size_t(l)];
    if (!v.is_null() && !v.is_number()) f.fail_rule(fmt::format("{}[{}] is not a number", f.path(key), l));
    const double x = v.is_null() ? 0.0 : v.get<double>();
    if (!c.is_moe_layer(l)) {
      if (x != 0) f.fail_rule(fmt::format("{}[{}] clamps a dense layer's FFN; hyla clamps only experts", f.path(key), l));
      continue;
    }
    if (limit < 0) limit = x;
    if (x != limit)
      f.fail_rule(fmt::format("{} differs between layers ({} and {}); SPEC has one limit", f.path(key), limit, x));
  }
  return std::max(limit, 0.0);
}

ModelConfig config_from_hf(const json& file, const std::string& config_path) {
  const json top = without_nulls(file);
  JsonFields f(top, config_path);
  const std::string& source = config_path;
  auto reject = [&](const char* key, const std::string& rule) { f.fail_rule(f.path(key) + " " + rule); };
  ModelConfig c;
  c.architecture = "ling3";
  read_required(f, source, "vocab_size", c.vocab_size);
  read_required(f, source, "hidden_size", c.hidden_size);
  read_required(f, source, "num_hidden_layers", c.num_hidden_layers);
  f.read("rms_norm_eps", c.rms_norm_eps);
  f.read("tie_word_embeddings", c.tie_word_embeddings);
  f.read("initializer_range", c.initializer_range);
  f.read("max_position_embeddings", c.max_position_embeddings);
  int64_t group = 0;
  read_required(f, source, "layer_group_size", group);
  if (group < 1) reject("layer_group_size", "must be >= 1");
  c.layer_types.assign(size_t(std::max<int64_t>(c.num_hidden_layers, 0)), LayerType::Kda);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if ((l + 1) % group == 0 || l >= c.num_hidden_layers / group * group) c.layer_types[size_t(l)] = LayerType::Mla;

  read_required(f, source, "num_attention_heads", c.kda.num_heads);
  c.mla.num_heads = c.kda.num_heads;
  read_required(f, source, "head_dim", c.kda.head_dim);
  f.read("short_conv_kernel_size", c.kda.conv_kernel);
  c.kda.gate = KdaGate::LowerBound;
  read_required(f, source, "kda_lower_bound", c.kda.gate_lower_bound);
  c.kda.gate_rank = c.kda.output_gate_rank = 0;
  bool safe_gate = false, no_lora = false;
  f.read("kda_safe_gate", safe_gate);
  if (!safe_gate) reject("kda_safe_gate", "is not true: hyla's KDA gate is the bounded (safe) one");
  f.read("no_kda_lora", no_lora);
  if (!no_lora) reject("no_kda_lora", "is not true: hyla reads Ling's full-rank KDA gates");
  std::string granularity;
  f.read("gated_attention_proj_granularity_type", granularity);
  if (granularity != "head_wise")
    reject("gated_attention_proj_granularity_type", fmt::format("is \"{}\": hyla reads \"head_wise\"", granularity));

  MlaConfig& m = c.mla;
  m.q_lora_rank = 0;
  f.read("q_lora_rank", m.q_lora_rank);
  read_required(f, source, "kv_lora_rank", m.kv_lora_rank);
  read_required(f, source, "qk_nope_head_dim", m.qk_nope_head_dim);
  read_required(f, source, "qk_rope_head_dim", m.qk_rope_head_dim);
  read_required(f, source, "v_head_dim", m.v_head_dim);
  f.read("rope_theta", m.rope_theta);
  if (f.has("rope_scaling")) reject("rope_scaling", "is set: hyla's RoPE has no scaling");
  m.rope = true;
  m.output_gate = m.output_gate_per_head = true;
  m.norm_eps = c.rms_norm_eps;

  MoeConfig& moe = c.moe;
  read_required(f, source, "num_experts", moe.num_experts);
  read_required(f, source, "num_experts_per_tok", moe.num_experts_per_tok);
  moe.num_shared_experts = 0;
  f.read("num_shared_experts", moe.num_shared_experts);
  read_required(f, source, "moe_intermediate_size", moe.moe_intermediate_size);
  f.read("moe_shared_expert_intermediate_size", moe.shared_intermediate_size);
  moe.first_k_dense_replace = 0;
  f.read("first_k_dense_replace", moe.first_k_dense_replace);
  f.read("intermediate_size", moe.intermediate_size);
  moe.routed_scaling_factor = 1.0;
  f.read("routed_scaling_factor", moe.routed_scaling_factor);
  bool renormalize = true;
  f.read("norm_topk_prob", renormalize);
  if (!renormalize) reject("norm_topk_prob", "is false: SPEC §5 renormalises the selected experts' weights");
  std::string score = "sigmoid", act = "silu";
  f.read(f.has("score_function") ? "score_function" : "scoring_func", score);
  if (score != "sigmoid") reject("score_function", fmt::format("is \"{}\": SPEC §5's router is a sigmoid", score));
  int64_t groups = 1, top_groups = 1;
  f.read("n_group", groups);
  f.read("topk_group", top_groups);
  if (groups > 1 || top_groups > 1)
    reject("n_group", "> 1: grouped routing is not implemented (SPEC §5 routes over all experts)");
  f.read("hidden_act", act);
  if (act != "silu") reject("hidden_act", fmt::format("is \"{}\": ling3 reads \"silu\" (swiglu)", act));
  moe.activation = moe.dense_activation = moe.shared_activation = Activation::Swiglu;
  moe.shared_full_width = false;
  moe.swiglu_limit = one_limit(f, "expert_swiglu_limit_list", c);
  moe.shared_swiglu_limit = one_limit(f, "share_expert_swiglu_limit_list", c);
  c.attn_res.enabled = false;
  return c;
}

// The layer number of "model.layers.N.…" (-1 for another name).
int64_t layer_of(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return -1;
  name.remove_prefix(prefix.size());
  int64_t layer = -1;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), layer);
  return error == std::errc() && end < name.data() + name.size() && *end == '.' ? layer : -1;
}

// The checkpoint's names (llama.cpp's converter's reading, conversion/bailingmoe3.py): attention.*
// is self_attn.*, its MLA output `dense` is o_proj; mlp.gate.expert_bias is the correction bias;
// model.word_embeddings is the embedding; the multi-token-prediction layers are skipped.
std::optional<HfTensor> hf_tensor(const std::string& name, const ModelConfig& c, const std::string& source) {
  if (name == "model.word_embeddings.weight") return HfTensor{"model.embed_tokens.weight"};
  const int64_t layer = layer_of(name, "model.layers.");
  if (layer < 0) return HfTensor{name};
  if (layer >= c.num_hidden_layers) return std::nullopt;
  const std::string p = fmt::format("model.layers.{}.", layer);
  std::string t = name.substr(p.size());
  if (t.starts_with("attention.")) {
    t = t.substr(std::string_view("attention.").size());
    const int64_t H = c.kda.num_heads, HK = H * c.kda.head_dim;
    if (t == "dense.weight") return HfTensor{p + "self_attn.o_proj.weight"};
    if (t == "A_log") return HfTensor{p + "self_attn.A_log", Shape{H}, true};
    if (t == "q_conv1d.weight" || t == "k_conv1d.weight" || t == "v_conv1d.weight")
      return HfTensor{p + "self_attn." + t, Shape{HK, 1, c.kda.conv_kernel}};
    return HfTensor{p + "self_attn." + t};
  }
  if (t == "mlp.gate.expert_bias") return HfTensor{p + "mlp.gate.e_score_correction_bias"};
  HYLA_CHECK(!t.starts_with("eh_proj") && !t.starts_with("enorm") && !t.starts_with("hnorm"),
             "{}: tensor '{}' is a multi-token-prediction tensor in a trunk layer", source, name);
  return HfTensor{name};
}

bool gguf_skips(const ModelConfig& c, std::string_view tensor) { return layer_of(tensor, "blk.") >= c.num_hidden_layers; }

ModelConfig read_gguf(const GgufKeys& keys) {
  const GgufFile& g = keys.file();
  const std::string source = keys.source();
  ModelConfig c;
  c.architecture = "ling3";
  const int64_t blocks = keys.integer("block_count"), nextn = keys.integer_or("nextn_predict_layers", 0);
  c.num_hidden_layers = blocks - nextn;
  HYLA_CHECK(nextn >= 0 && c.num_hidden_layers >= 1 && g.find(fmt::format("blk.{}.attn_norm.weight", c.num_hidden_layers - 1)),
             "{}: {} {} less {} {} leaves no trunk layer whose tensors the file holds", source, keys.key("block_count"),
             blocks, keys.key("nextn_predict_layers"), nextn);
  c.hidden_size = keys.integer("embedding_length");
  c.max_position_embeddings = keys.integer("context_length");
  c.rms_norm_eps = keys.number("attention.layer_norm_rms_epsilon");
  c.vocab_size = g.tensor("token_embd.weight").ne.at(1);
  c.tie_word_embeddings = g.find("output.weight") == nullptr;
  const std::vector<int64_t> kv_heads = keys.integers("attention.head_count_kv");
  HYLA_CHECK(int64_t(kv_heads.size()) >= c.num_hidden_layers, "{}: {} lists {} layers, the trunk has {}", source,
             keys.key("attention.head_count_kv"), kv_heads.size(), c.num_hidden_layers);
  c.layer_types.clear();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    c.layer_types.push_back(kv_heads[size_t(l)] == 0 ? LayerType::Kda : LayerType::Mla);
  const int64_t heads = keys.uniform("attention.head_count");

  KdaConfig& kda = c.kda;
  kda.num_heads = heads;
  kda.head_dim = keys.integer("kda.head_dim");
  kda.conv_kernel = keys.integer("ssm.conv_kernel");
  HYLA_CHECK(!keys.has("kda.safe_gate") || keys.boolean("kda.safe_gate"), "{}: {} is false; hyla's gate is the safe one",
             source, keys.key("kda.safe_gate"));
  kda.gate = KdaGate::LowerBound;
  kda.gate_lower_bound = keys.number("kda.gate_lower_bound");
  kda.gate_rank = kda.output_gate_rank = 0;

  MlaConfig& mla = c.mla;
  mla.num_heads = heads;
  mla.q_lora_rank = keys.integer_or("attention.q_lora_rank", 0);
  mla.kv_lora_rank = keys.integer("attention.kv_lora_rank");
  mla.qk_rope_head_dim = keys.integer_or("rope.dimension_count", 0);
  const int64_t key_length = keys.integer("attention.key_length_mla");
  mla.qk_nope_head_dim = key_length - mla.qk_rope_head_dim;
  HYLA_CHECK(mla.qk_nope_head_dim >= 0, "{}: attention.key_length_mla {} is less than the rope width {}", source,
             key_length, mla.qk_rope_head_dim);
  mla.v_head_dim = keys.integer("attention.value_length_mla");
  if (keys.has("rope.freq_base")) mla.rope_theta = keys.number("rope.freq_base");
  mla.rope = true;
  mla.output_gate = mla.output_gate_per_head = true;
  mla.norm_eps = c.rms_norm_eps;
  mla.sliding_window = 0;

  read_gguf_moe(keys, c);
  MoeConfig& moe = c.moe;
  moe.shared_intermediate_size = keys.integer_or("expert_shared_feed_forward_length", 0);
  HYLA_CHECK(keys.has("expert_weights_norm") && keys.boolean("expert_weights_norm"),
             "{}: {} is not true; SPEC always renormalises the top-k weights", source, keys.key("expert_weights_norm"));
  moe.latent_dim = 0;
  moe.activation = moe.dense_activation = moe.shared_activation = Activation::Swiglu;
  moe.shared_full_width = false;
  // Per-layer clamps as one value each (the dense layers' none), as the HF reading requires.
  auto limit = [&](const char* name) {
    if (!keys.has(name)) return 0.0;
    const std::vector<double> values = keys.numbers(name);
    double one = -1;
    for (int64_t l = 0; l < c.num_hidden_layers && l < int64_t(values.size()); ++l) {
      const double x = values[size_t(l)];
      if (!c.is_moe_layer(l)) {
        HYLA_CHECK(x == 0, "{}: {} clamps dense layer {}'s FFN; hyla clamps only experts", source, keys.key(name), l);
        continue;
      }
      if (one < 0) one = x;
      HYLA_CHECK(x == one, "{}: {} differs between layers ({} and {}); SPEC has one limit", source, keys.key(name), one, x);
    }
    return std::max(one, 0.0);
  };
  moe.swiglu_limit = limit("swiglu_clamp_exp");
  moe.shared_swiglu_limit = limit("swiglu_clamp_shexp");
  c.attn_res.enabled = false;
  c.vision.enabled = false;
  return c;
}

void write_gguf(const ModelConfig& c, GgufKeyWriter& keys) {
  write_gguf_trunk(c, keys);
  write_gguf_moe(c, keys);
  if (c.mla.q_lora_rank > 0) keys.u32("attention.q_lora_rank", c.mla.q_lora_rank);
  keys.boolean("kda.safe_gate", true);
  keys.f32("kda.gate_lower_bound", c.kda.gate_lower_bound);
  const MoeConfig& moe = c.moe;
  keys.u32("expert_shared_feed_forward_length", moe.shared_width());
  keys.boolean("expert_weights_norm", true);
  std::vector<double> routed, shared;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    routed.push_back(c.is_moe_layer(l) ? moe.swiglu_limit : 0.0);
    shared.push_back(c.is_moe_layer(l) ? moe.shared_swiglu_limit : 0.0);
  }
  keys.f32_array("swiglu_clamp_exp", routed);
  keys.f32_array("swiglu_clamp_shexp", shared);
}

std::vector<GgufTensorMap> gguf_tensors(const ModelConfig& cfg) {
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size;
  const KdaConfig& k = cfg.kda;
  const int64_t HK = k.num_heads * k.head_dim;
  GgufTable t;
  t.add("token_embd.weight", {d, V}, GgufLink::Same, {"model.embed_tokens.weight"}, true);
  t.add("output_norm.weight", {d}, GgufLink::Same, {"model.norm.weight"}, false);
  if (!cfg.tie_word_embeddings) t.add("output.weight", {d, V}, GgufLink::Same, {"lm_head.weight"}, true);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l), p = fmt::format("model.layers.{}.", l);
    const std::string a = p + "self_attn.", f = p + "mlp.";
    t.add(b + "attn_norm.weight", {d}, GgufLink::Same, {p + "input_layernorm.weight"}, false);
    t.add(b + "ffn_norm.weight", {d}, GgufLink::Same, {p + "post_attention_layernorm.weight"}, false);
    if (!cfg.is_attention_layer(l)) {
      add_gguf_kda_qkv(t, cfg, b, a);
      t.add(b + "ssm_f_a.weight", {d, HK}, GgufLink::Same, {a + "f_proj.weight"}, true);
      t.add(b + "ssm_beta.weight", {d, k.num_heads}, GgufLink::Same, {a + "b_proj.weight"}, true);
      t.add(b + "ssm_a", {1, k.num_heads}, GgufLink::Exp, {a + "A_log"}, false);
      t.add(b + "ssm_dt.bias", {HK}, GgufLink::Same, {a + "dt_bias"}, false);
      t.add(b + "ssm_g_a.weight", {d, HK}, GgufLink::Same, {a + "g_proj.weight"}, true);
      t.add(b + "ssm_norm.weight", {k.head_dim}, GgufLink::Same, {a + "o_norm.weight"}, false);
      t.add(b + "attn_output.weight", {HK, d}, GgufLink::Same, {a + "o_proj.weight"}, true);
    } else {
      add_gguf_mla(t, cfg, b, a);
    }
    add_gguf_ffn(t, cfg, l, b, f, d);
    if (cfg.is_moe_layer(l) && cfg.moe.num_shared_experts > 0) add_gguf_shared_experts(t, cfg, b, f, d);
  }
  return t.maps;
}

}  // namespace

extern const Architecture kLing3Architecture;
const Architecture kLing3Architecture{
    .name = "ling3",
    .summary = "KDA (bounded decay gate, full-rank decay and output gates) and MLA (RoPE on q_pe and k_pe, one "
               "output gate per head); sigmoid-routed MoE with shared experts of their own width, SwiGLU clamped; "
               "plain residuals; multi-token-prediction layers skipped",
    .check = check,
    .hf_model_type = "bailing_moe_v3",
    .hf_class = "BailingMoeV3ForCausalLM",
    .config_from_hf = config_from_hf,
    .hf_tensor = hf_tensor,
    .gguf_arch = "bailingmoe3",
    .read_gguf = read_gguf,
    .write_gguf = write_gguf,
    .gguf_tensors = gguf_tensors,
    .gguf_skips = gguf_skips,
};

}  // namespace hyla
