#pragma once
// config.json (SPEC §1): the model's hyperparameters, parsed strictly and validated.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "hyla/kernels/activations.h"
#include "hyla/kernels/resample.h"

namespace hyla {

enum class LayerType { Kda, Mla, Swa };
enum class KdaGate { LowerBound, Softplus };
enum class Activation { Swiglu, Situ };
enum class Balancing { Quantile, BiasSign, AuxLoss, None };

struct KdaConfig {
  int64_t num_heads = 8;
  int64_t head_dim = 64;
  int64_t conv_kernel = 4;
  KdaGate gate = KdaGate::LowerBound;
  double gate_lower_bound = -5.0;
  int64_t chunk_size = 64;
  int64_t gate_rank = 0;         // > 0: decay logits f_b(f_a u) through this rank (f_a_proj, f_b_proj)
  int64_t output_gate_rank = 0;  // > 0: output gate logits g_b(g_a u) through this rank (g_a_proj, g_b_proj)
};

struct MlaConfig {
  int64_t num_heads = 8;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 128;
  int64_t qk_nope_head_dim = 64;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 64;
  double rope_theta = 10000.0;
  bool output_gate = true;
  bool output_gate_per_head = false;  // one σ per head, W_g [H, d] (Ling 3.0); false: one per channel, [H·Dv, d]
  int64_t sliding_window = 0;
  bool rope = true;  // false: q_pe and k_pe (qk_rope_head_dim > 0) enter the scores unrotated
  double norm_eps = 1e-5;  // the q_a and kv_a latent norms' eps (SPEC §4.3); absent from a config: rms_norm_eps
};

struct MoeConfig {
  int64_t num_experts = 128;
  int64_t num_experts_per_tok = 4;
  int64_t num_shared_experts = 1;
  int64_t moe_intermediate_size = 128;
  int64_t shared_intermediate_size = 0;  // the shared experts' hidden width; 0: num_shared_experts · moe_intermediate_size
  int64_t first_k_dense_replace = 1;
  int64_t intermediate_size = 1408;
  int64_t router_latent_dim = 0;
  int64_t latent_dim = 0;
  double routed_scaling_factor = 2.5;
  Activation activation = Activation::Swiglu;         // routed experts
  Activation dense_activation = Activation::Swiglu;   // the dense FFN layers
  Activation shared_activation = Activation::Swiglu;  // the shared experts
  double situ_beta = 4.0;                             // situ: β·tanh(a/β)·σ(a)
  double situ_linear_beta = 25.0;                     // situ: ⊙ λ·tanh(b/λ) (λ ≤ 0: ⊙ b)
  double swiglu_limit = 0.0;         // > 0: the routed experts' SwiGLU clamped, min(silu(a), L) ⊙ clamp(b, −L, L)
  double shared_swiglu_limit = 0.0;  // > 0: the shared experts' SwiGLU clamped alike
  bool shared_full_width = false;  // shared experts on u at width d, added after lat_up (not on x_e)
  bool latent_norm = true;         // RMSNorm m (lat_norm) before lat_up; false: lat_up reads m as it is
  Balancing balancing = Balancing::Quantile;
  double bias_update_speed = 0.001;
  double aux_loss_coef = 0.0;

  int64_t shared_width() const {
    return shared_intermediate_size > 0 ? shared_intermediate_size : num_shared_experts * moe_intermediate_size;
  }
};

struct AttnResConfig {
  bool enabled = true;
  int64_t block_size = 2;
};

enum class VisionTower { Patches, MoonVit };  // SPEC §7.1, §7.2
enum class VisionNorm { LayerNorm, RmsNorm };  // MoonViT's: K2.5's LayerNorm with bias, K3's RMSNorm
enum class VisionProjector { PatchMerger, PatchMergerV2 };  // K2.5's, K3's

// MoonViT's options (SPEC §7.2); the patch size and channels are VisionConfig's, the output width
// is the model's hidden_size.
struct MoonVitConfig {
  int64_t hidden_size = 1152, num_heads = 16, head_dim = 72, num_layers = 27, intermediate_size = 4304;
  int64_t pos_emb_height = 64, pos_emb_width = 64;  // the learned grid, resized to each image's
  GridResample pos_emb_resample = GridResample::Bicubic;
  VisionNorm norm = VisionNorm::LayerNorm;
  double norm_eps = 1e-5;
  bool bias = true;  // of the patch convolution, wqkv, wo, fc0 and fc1
  double rope_theta = 10000.0;
  int64_t merge = 2;
  VisionProjector projector = VisionProjector::PatchMerger;
  double projector_eps = 1e-5;
  // The projector MLP's GELU: the official nn.GELU() is erf; llama.cpp's kimik25 graph computes tanh.
  Gelu projector_gelu = Gelu::Erf;
  // The processor's rules (data/moonvit_image.h): patches an image may have, and along one side.
  int64_t in_patch_limit = 16384, patch_limit_on_one_side = 512;
  std::vector<double> image_mean{0.5, 0.5, 0.5}, image_std{0.5, 0.5, 0.5};
};

struct VisionConfig {
  bool enabled = false;
  VisionTower tower = VisionTower::Patches;
  int64_t patch_size = 7;
  int64_t channels = 1;
  int64_t max_grid = 8;  // the patch embedding's grid (tower "patches")
  MoonVitConfig moonvit;  // tower "moonvit"
  // Pixels along each side of the square one image position covers: a patch, or MoonViT's merge
  // window of patches.
  int64_t position_pixels() const { return tower == VisionTower::MoonVit ? moonvit.merge * patch_size : patch_size; }
};

struct ModelConfig {
  // The architecture the options belong to (model/arch/architecture.h): "hyla" (every SPEC option),
  // "kimi_k3", "kimi_linear". It names the model's file formats and the rules its options keep; the
  // model's computation reads only the options.
  std::string architecture = "hyla";
  int64_t vocab_size = 8192;
  int64_t hidden_size = 512;
  int64_t num_hidden_layers = 8;
  std::vector<LayerType> layer_types;  // defaults to SPEC §1's 8-layer pattern
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  int64_t max_position_embeddings = 1048576;
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  AttnResConfig attn_res;
  VisionConfig vision;

  // Parses and validates hyla's own config.json; `source` names the file in error messages. Any
  // config.json, a Hugging Face checkpoint's too, is read by model_config_of (model/model_files.h).
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source = "config.json");
  nlohmann::json to_json() const;  // every key, so a saved config.json is complete
  nlohmann::json vision_json() const;  // the "vision" object (moonvit's keys with that tower only)
  void validate(const std::string& source = "config.json") const;

  bool is_moe_layer(int64_t layer) const { return layer >= moe.first_k_dense_replace; }
  bool is_attention_layer(int64_t layer) const { return layer_types[size_t(layer)] != LayerType::Kda; }
};

const char* to_string(LayerType t);
const char* to_string(KdaGate g);
const char* to_string(Activation a);
const char* to_string(Balancing b);
const char* to_string(VisionTower t);
const char* to_string(VisionNorm n);
const char* to_string(VisionProjector p);
const char* to_string(GridResample r);

}  // namespace hyla
