#pragma once
// The GGUF keys and tensors that llama.cpp names alike in every architecture of the KDA + MLA +
// sigmoid-MoE family hyla reads (kimi-k3, kimi-linear, bailingmoe3): the architecture files
// (model/arch/kimi_family.cpp, ling3.cpp) build their tables and metadata from these pieces and
// add what is theirs.
#include <string>
#include <vector>

#include "hyla/model/arch/architecture.h"

namespace hyla {

struct GgufTable {
  std::vector<GgufTensorMap> maps;
  void add(std::string gguf, std::vector<int64_t> ne, GgufLink link, std::vector<std::string> hyla, bool matrix) {
    maps.push_back({std::move(gguf), std::move(ne), link, std::move(hyla), matrix});
  }
};

// `b` is a layer's GGUF prefix ("blk.3."), `a` its mixer's hyla prefix ("model.layers.3.self_attn."),
// `f` its FFN's ("model.layers.3.mlp.").
// KDA's q, k and v projections and their convolutions.
void add_gguf_kda_qkv(GgufTable& t, const ModelConfig& c, const std::string& b, const std::string& a);
// An MLA layer: q (or q_a, its norm, q_b), kv_a, its norm, k_b and v_b from kv_b_proj, the output
// gate (per channel, or per head) and the output projection.
void add_gguf_mla(GgufTable& t, const ModelConfig& c, const std::string& b, const std::string& a);
// Layer `l`'s dense FFN; or its router, correction bias and stacked experts (`expert_in` wide).
void add_gguf_ffn(GgufTable& t, const ModelConfig& c, int64_t l, const std::string& b, const std::string& f,
                  int64_t expert_in);
// The shared experts, one MLP of moe.shared_width() on `shared_in`.
void add_gguf_shared_experts(GgufTable& t, const ModelConfig& c, const std::string& b, const std::string& f,
                             int64_t shared_in);

// The trunk's keys (lengths, layer count, head counts and which layers attend, the RMSNorm eps) and
// the mixers' dimensions (MLA's latent and head widths, RoPE's, KDA's conv and head width).
void write_gguf_trunk(const ModelConfig& c, GgufKeyWriter& keys);
// The MoE's keys: experts, how many a token uses, widths, the dense layers, the scale, the
// sigmoid router.
void write_gguf_moe(const ModelConfig& c, GgufKeyWriter& keys);
// The same read, checked against the first MoE layer's router (before anything is sized from
// them); grouped routing and another router are errors.
void read_gguf_moe(const GgufKeys& keys, ModelConfig& c);

}  // namespace hyla
