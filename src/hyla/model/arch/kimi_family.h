#pragma once
// What Kimi K3 and Kimi Linear share (model/arch/kimi_k3.cpp and kimi_linear.cpp hold what each
// adds): the Hugging Face config keys of the text model, the checkpoint's tensor names, llama.cpp's
// GGUF keys and tensor table (docs/kimi-llamacpp.md §3–4), and the rules both architectures keep.
#include <optional>
#include <string>
#include <vector>

#include "hyla/io/json_fields.h"
#include "hyla/model/arch/architecture.h"

namespace hyla {

// The rules of both Kimi architectures: KDA and MLA layers with one head count, the decay gate
// through rank head_dim, q_pe and k_pe unrotated, a sigmoid router on u, at most 1024 experts
// (llama.cpp's limit), images only through MoonViT.
void check_kimi(const ModelConfig& c, const Requirement& require);

// The text model's keys of a Kimi config.json (`f`: the top level for Kimi Linear, text_config for
// K3). docs/SPEC.md §1: linear_attn_config.full_attn_layers (1-based) → layer_types; the decay gate
// through rank linear_attn_config.head_dim (f_a_proj/f_b_proj), the output gate full rank when
// use_full_rank_gate, else through that rank too; gate_lower_bound null or absent → the softplus
// gate; mla_use_nope → mla.rope false; routed_expert_hidden_size → moe.latent_dim,
// latent_moe_use_norm → moe.latent_norm; hidden_act "situ" → SiTU in every FFN with
// activation_situ_beta / activation_situ_linear_beta (null: 0, the up branch unbounded) and the
// shared experts on u after the latent up-projection; "silu" → swiglu; attn_res_block_size →
// attn_res. Values hyla does not implement (grouped routing, a router other than sigmoid, no
// renormalisation) are errors naming the key; keys it does not need (token ids, auto_map,
// quantization_config) are ignored.
ModelConfig kimi_text_config(JsonFields& f, const std::string& source);

// HF writes settings that do not apply as null ("q_lora_rank": null): dropped, they read as absent.
nlohmann::json without_nulls(const nlohmann::json& j);

// A checkpoint tensor's hyla name, as llama.cpp's converter reads the release (docs/kimi-llamacpp.md §4):
//   language_model.*                       the text model (the prefix is dropped)
//   vision_tower.*, mm_projector.*         MoonViT's own names (SPEC §7.2), skipped without a tower
//   block_sparse_moe.gate, .shared_experts → mlp.gate, mlp.shared_experts
//   block_sparse_moe.experts.E.w1|w2|w3    → mlp.experts.E.gate_proj|down_proj|up_proj (compressed-
//                                            tensors MXFP4 packs as hyla's MXFP4 codes and scales)
//   block_sparse_moe.routed_expert_down_proj|up_proj|norm → mlp.lat_down|lat_up|lat_norm
//   self_attention_res_proj|norm, mlp_res_proj|norm, output_attn_res_proj|norm
//                                          → attn_res_query|norm, mlp_res_query|norm, out_res_query|norm
//   self_attn.A_log [1, 1, H, 1] or [H…]   → A_log [H] (its first H values)
//   self_attn.{q,k,v}_conv1d [H·K, kernel] → [H·K, 1, kernel]
// Every other name is hyla's already.
std::optional<HfTensor> kimi_hf_tensor(const std::string& name, const ModelConfig& c, const std::string& source);

// llama.cpp's keys both GGUF architectures write alike, read (the values only kimi-k3 has, absent,
// read as Kimi Linear's: no latent experts, no attention residuals) and written.
ModelConfig read_kimi_gguf(const GgufKeys& keys);
void write_kimi_gguf(const ModelConfig& c, GgufKeyWriter& keys);

// The tensor table: `a_log_ne` is ssm_a's shape as the architecture's converter writes it.
std::vector<GgufTensorMap> kimi_gguf_tensors(const ModelConfig& c, const std::vector<int64_t>& a_log_ne);

}  // namespace hyla
