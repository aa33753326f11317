// Kimi K3 (Moonshot AI; 2.8T total, 104B active, 896 experts): SPEC's layer with the bounded KDA
// decay gate and a full-rank output gate, MLA with NoPE, a per-head output gate and a low-rank q,
// latent MoE (the routed experts at routed_expert_hidden_size, the shared experts at full width)
// with SiTU in every FFN, block attention residuals, and MoonViT (SPEC §7.2) for images.
// Hugging Face: model_type "kimi_k3", the text model under text_config, the tower under
// vision_config, the processor in preprocessor_config.json. llama.cpp: "kimi-k3" (its text model;
// the tower goes to a kimik25 mmproj only in K2.5's variant, model/moonvit_gguf.h).
#include <algorithm>
#include <filesystem>

#include "hyla/core/error.h"
#include "hyla/model/arch/kimi_family.h"

namespace hyla {
namespace {

using json = nlohmann::json;

template <typename T>
void read_required(JsonFields& f, const std::string& source, const char* key, T& out) {
  HYLA_CHECK(f.has(key), "{}: {} is required", source, f.path(key));
  f.read(key, out);
}

void check(const ModelConfig& c, const Requirement& require) {
  check_kimi(c, require);
  const MoeConfig& moe = c.moe;
  require(c.kda.output_gate_rank == 0, "kimi-k3's KDA output gate is full rank (kda.output_gate_rank must be 0)");
  require(moe.activation == Activation::Situ && moe.dense_activation == Activation::Situ &&
              (moe.num_shared_experts == 0 || moe.shared_activation == Activation::Situ),
          "kimi-k3 uses SiTU in every FFN (moe.activation, dense_activation, shared_activation)");
  require(moe.latent_dim == 0 || moe.num_shared_experts == 0 || moe.shared_full_width,
          "kimi-k3's shared experts read u at full width (moe.shared_full_width)");
}

// K3's vision_config (SPEC §7.2): MoonViT and its projector. What hyla does not implement (video's
// temporal pooling aside, which images never reach) is refused by name.
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

// The checkpoint's preprocessor_config.json (its keys under media_proc_cfg, or at the top):
// in_patch_limit, patch_limit_on_one_side, image_mean and image_std; patch_size and
// merge_kernel_size, where present, must agree with vision_config. Its other keys (video, auto_map)
// are not read.
void read_preprocessor_config(const json& file, const std::string& source, ModelConfig& c) {
  HYLA_CHECK(file.is_object(), "{}: not a JSON object", source);
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

ModelConfig config_from_hf(const json& file, const std::string& config_path) {
  const json top = without_nulls(file);
  JsonFields root(top, config_path);
  JsonFields text = root.object("text_config");
  ModelConfig c = kimi_text_config(text, config_path);
  c.architecture = "kimi_k3";
  if (root.has("vision_config")) {
    JsonFields v = root.object("vision_config");
    read_vision_config(v, config_path, c);
    c.validate(config_path);
    // The processor's limits and normalisation live beside config.json in a checkpoint.
    const std::filesystem::path processor = std::filesystem::path(config_path).parent_path() / "preprocessor_config.json";
    std::error_code ec;
    if (std::filesystem::is_regular_file(processor, ec))
      read_preprocessor_config(parse_json_file(processor.string()), processor.string(), c);
  }
  return c;
}

ModelConfig read_gguf(const GgufKeys& keys) {
  const GgufFile& g = keys.file();
  const std::string source = keys.source();
  ModelConfig c = read_kimi_gguf(keys);
  c.architecture = "kimi_k3";
  c.kda.output_gate_rank = 0;
  MlaConfig& mla = c.mla;
  mla.q_lora_rank = keys.integer_or("attention.q_lora_rank", 0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_attention_layer(l)) {  // the first attention layer's tensors say for all
      mla.output_gate = g.find(fmt::format("blk.{}.attn_gate.weight", l)) != nullptr;
      if (g.find(fmt::format("blk.{}.attn_q_a.weight", l)) == nullptr) mla.q_lora_rank = 0;
      break;
    }
  MoeConfig& moe = c.moe;
  HYLA_CHECK(keys.has("expert_weights_norm") && keys.boolean("expert_weights_norm"),
             "{}: {} is not true; SPEC always renormalises the top-k weights", source, keys.key("expert_weights_norm"));
  moe.latent_dim = keys.integer_or("expert_latent_length", 0);
  moe.activation = moe.dense_activation = moe.shared_activation = Activation::Situ;
  moe.situ_beta = keys.number("activation.situ_beta");
  moe.situ_linear_beta = keys.number("activation.situ_linear_beta");
  moe.shared_full_width = moe.latent_dim > 0;
  // ffn_routed_norm is optional in llama.cpp's graph, which then skips the norm: so does SPEC
  // (moe.latent_norm false). Its first MoE layer says for all; the others must agree (tensor check).
  moe.latent_norm =
      moe.latent_dim == 0 || g.find(fmt::format("blk.{}.ffn_routed_norm.weight", moe.first_k_dense_replace)) != nullptr;
  const int64_t block = keys.integer("attn_res.block_size");
  c.attn_res.enabled = block > 0;
  c.attn_res.block_size = block > 0 ? block : AttnResConfig{}.block_size;
  return c;
}

void write_gguf(const ModelConfig& c, GgufKeyWriter& keys) {
  write_kimi_gguf(c, keys);
  const MlaConfig& m = c.mla;
  keys.u32("attention.value_length", m.kv_lora_rank);
  if (m.q_lora_rank > 0) keys.u32("attention.q_lora_rank", m.q_lora_rank);
  if (c.kda.gate == KdaGate::LowerBound) keys.f32("kda.gate_lower_bound", c.kda.gate_lower_bound);
  const MoeConfig& moe = c.moe;
  keys.boolean("expert_weights_norm", true);
  if (moe.latent_dim > 0) keys.u32("expert_latent_length", moe.latent_dim);
  keys.u32("attn_res.block_size", c.attn_res.enabled ? c.attn_res.block_size : 0);
  keys.f32("activation.situ_beta", moe.situ_beta);
  keys.f32("activation.situ_linear_beta", moe.situ_linear_beta);
}

}  // namespace

extern const Architecture kKimiK3Architecture;
const Architecture kKimiK3Architecture{
    .name = "kimi_k3",
    .summary = "KDA (bounded decay gate, full-rank output gate) and MLA (NoPE, per-head output gate, low-rank q); "
               "latent MoE with SiTU and full-width shared experts; block attention residuals; MoonViT",
    .check = check,
    .hf_model_type = "kimi_k3",
    .config_from_hf = config_from_hf,
    .hf_tensor = kimi_hf_tensor,
    .gguf_arch = "kimi-k3",
    .read_gguf = read_gguf,
    .write_gguf = write_gguf,
    .gguf_tensors = [](const ModelConfig& c) { return kimi_gguf_tensors(c, {c.kda.num_heads}); },
};

}  // namespace hyla
