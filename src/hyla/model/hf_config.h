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
// errors naming the key; keys it does not need (tokens ids, auto_map, quantization_config, the
// vision tower's) are ignored.
#include <nlohmann/json.hpp>

#include <string>

#include "hyla/model/config.h"

namespace hyla {

// Whether `j` is a Hugging Face config.json (a model_type other than "hyla").
bool is_hf_config(const nlohmann::json& j);

// The ModelConfig of a kimi_k3 or kimi_linear config.json; `source` names the file in errors.
ModelConfig config_from_hf(const nlohmann::json& j, const std::string& source);

}  // namespace hyla
