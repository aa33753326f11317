#pragma once
// A Hugging Face config.json of the model class hyla implements (Kimi K3: model_type "kimi_k3"
// with the text model under text_config; Kimi Linear: "kimi_linear") read as the ModelConfig
// that SPEC §1 describes, so that `hyla plan` and the loaders take the released files as they are.
//
// The mapping (docs/SPEC.md §1): linear_attn_config.full_attn_layers (1-based) → layer_types;
// the decay gate through rank linear_attn_config.head_dim (f_a_proj/f_b_proj), the output gate
// full rank when use_full_rank_gate, else through that rank too; gate_lower_bound null or absent
// → the softplus gate; mla_use_nope → mla.rope false; routed_expert_hidden_size → moe.latent_dim,
// latent_moe_use_norm → moe.latent_norm;
// hidden_act "situ" → SiTU in every FFN with activation_situ_beta / activation_situ_linear_beta
// (null: 0, the up branch unbounded) and the shared experts on u after the latent up-projection;
// "silu" → swiglu; attn_res_block_size → attn_res. Values this engine does not implement (grouped
// routing, a router other than sigmoid, no renormalisation) are
// errors naming the key; keys it does not need (tokens ids, auto_map, quantization_config) are
// ignored. K3's vision_config is read strictly (MoonViT, SPEC §7.2), and the checkpoint's
// preprocessor_config.json beside it gives the processor's limits and normalisation.
#include <nlohmann/json.hpp>

#include <string>

#include "hyla/model/config.h"

namespace hyla {

// Whether `j` is a Hugging Face config.json (a model_type other than "hyla").
bool is_hf_config(const nlohmann::json& j);

// The ModelConfig of a kimi_k3 or kimi_linear config.json; `source` names the file in errors.
ModelConfig config_from_hf(const nlohmann::json& j, const std::string& source);

// A checkpoint's preprocessor_config.json (its keys under media_proc_cfg, or at the top) into
// `c`'s MoonViT processor: in_patch_limit, patch_limit_on_one_side, image_mean and image_std;
// patch_size and merge_kernel_size, where present, must agree with vision_config. The processor's
// other keys (video, auto_map) are not read.
void read_hf_preprocessor_config(const nlohmann::json& j, const std::string& source, ModelConfig& c);

}  // namespace hyla
