#pragma once
// A Hugging Face checkpoint of Kimi K3 or Kimi Linear (config.json of model_type kimi_k3 or
// kimi_linear, read by hf_config.h; safetensors shards) as hyla's SPEC tensors. The names are
// llama.cpp's converter's reading of the release (docs/kimi-llamacpp.md §4):
//   language_model.*                       the text model (the prefix is dropped)
//   vision_tower.*, mm_projector.*         skipped: hyla reads the text model
//   block_sparse_moe.gate, .shared_experts → mlp.gate, mlp.shared_experts
//   block_sparse_moe.experts.E.w1|w2|w3    → mlp.experts.E.gate_proj|down_proj|up_proj
//   block_sparse_moe.routed_expert_down_proj|up_proj|norm → mlp.lat_down|lat_up|lat_norm
//   self_attention_res_proj|norm, mlp_res_proj|norm, output_attn_res_proj|norm
//                                          → attn_res_query|norm, mlp_res_query|norm, out_res_query|norm
//   self_attn.A_log [1, 1, H, 1] or [H…]   → A_log [H] (its first H values)
//   self_attn.{q,k,v}_conv1d [H·K, kernel] → [H·K, 1, kernel]
// Every other name is hyla's already. Tensors stay views of the mapped shards.
#include <memory>
#include <string>

#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"

namespace hyla {

ModelWeights weights_from_hf(std::shared_ptr<const ModelWeights> checkpoint, const ModelConfig& config);

}  // namespace hyla
