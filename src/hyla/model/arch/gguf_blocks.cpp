#include "hyla/model/arch/gguf_blocks.h"

#include <algorithm>

#include "hyla/core/error.h"

namespace hyla {

void add_gguf_kda_qkv(GgufTable& t, const ModelConfig& c, const std::string& b, const std::string& a) {
  const int64_t d = c.hidden_size, HK = c.kda.num_heads * c.kda.head_dim;
  for (const char* x : {"q", "k", "v"}) {
    t.add(b + fmt::format("attn_{}.weight", x), {d, HK}, GgufLink::Same, {a + fmt::format("{}_proj.weight", x)}, true);
    t.add(b + fmt::format("ssm_conv1d_{}.weight", x), {c.kda.conv_kernel, 1, HK, 1}, GgufLink::Same,
          {a + fmt::format("{}_conv1d.weight", x)}, false);
  }
}

void add_gguf_mla(GgufTable& t, const ModelConfig& c, const std::string& b, const std::string& a) {
  const MlaConfig& m = c.mla;
  const int64_t d = c.hidden_size, H = m.num_heads, dq = H * (m.qk_nope_head_dim + m.qk_rope_head_dim);
  if (m.q_lora_rank == 0) {
    t.add(b + "attn_q.weight", {d, dq}, GgufLink::Same, {a + "q_proj.weight"}, true);
  } else {
    t.add(b + "attn_q_a.weight", {d, m.q_lora_rank}, GgufLink::Same, {a + "q_a_proj.weight"}, true);
    t.add(b + "attn_q_a_norm.weight", {m.q_lora_rank}, GgufLink::Same, {a + "q_a_layernorm.weight"}, false);
    t.add(b + "attn_q_b.weight", {m.q_lora_rank, dq}, GgufLink::Same, {a + "q_b_proj.weight"}, true);
  }
  t.add(b + "attn_kv_a_mqa.weight", {d, m.kv_lora_rank + m.qk_rope_head_dim}, GgufLink::Same,
        {a + "kv_a_proj_with_mqa.weight"}, true);
  t.add(b + "attn_kv_a_norm.weight", {m.kv_lora_rank}, GgufLink::Same, {a + "kv_a_layernorm.weight"}, false);
  t.add(b + "attn_k_b.weight", {m.qk_nope_head_dim, m.kv_lora_rank, H}, GgufLink::KeyB, {a + "kv_b_proj.weight"}, true);
  t.add(b + "attn_v_b.weight", {m.kv_lora_rank, m.v_head_dim, H}, GgufLink::ValueB, {a + "kv_b_proj.weight"}, true);
  if (m.output_gate)
    t.add(b + "attn_gate.weight", {d, m.output_gate_per_head ? H : H * m.v_head_dim}, GgufLink::Same,
          {a + "g_proj.weight"}, true);
  t.add(b + "attn_output.weight", {H * m.v_head_dim, d}, GgufLink::Same, {a + "o_proj.weight"}, true);
}

void add_gguf_ffn(GgufTable& t, const ModelConfig& c, int64_t l, const std::string& b, const std::string& f,
                  int64_t expert_in) {
  const int64_t d = c.hidden_size;
  const MoeConfig& moe = c.moe;
  if (!c.is_moe_layer(l)) {
    for (const char* x : {"gate", "up"})
      t.add(b + fmt::format("ffn_{}.weight", x), {d, moe.intermediate_size}, GgufLink::Same,
            {f + fmt::format("{}_proj.weight", x)}, true);
    t.add(b + "ffn_down.weight", {moe.intermediate_size, d}, GgufLink::Same, {f + "down_proj.weight"}, true);
    return;
  }
  t.add(b + "ffn_gate_inp.weight", {d, moe.num_experts}, GgufLink::Same, {f + "gate.weight"}, false);
  t.add(b + "exp_probs_b.bias", {moe.num_experts}, GgufLink::Same, {f + "gate.e_score_correction_bias"}, false);
  for (const char* x : {"gate", "up", "down"}) {
    std::vector<std::string> experts;
    for (int64_t e = 0; e < moe.num_experts; ++e) experts.push_back(f + fmt::format("experts.{}.{}_proj.weight", e, x));
    const bool down = std::string(x) == "down";
    t.add(b + fmt::format("ffn_{}_exps.weight", x),
          down ? std::vector<int64_t>{moe.moe_intermediate_size, expert_in, moe.num_experts}
               : std::vector<int64_t>{expert_in, moe.moe_intermediate_size, moe.num_experts},
          GgufLink::Experts, experts, true);
  }
}

void add_gguf_shared_experts(GgufTable& t, const ModelConfig& c, const std::string& b, const std::string& f,
                             int64_t shared_in) {
  const int64_t w = c.moe.shared_width();
  for (const char* x : {"gate", "up"})
    t.add(b + fmt::format("ffn_{}_shexp.weight", x), {shared_in, w}, GgufLink::Same,
          {f + fmt::format("shared_experts.{}_proj.weight", x)}, true);
  t.add(b + "ffn_down_shexp.weight", {w, shared_in}, GgufLink::Same, {f + "shared_experts.down_proj.weight"}, true);
}

void write_gguf_trunk(const ModelConfig& c, GgufKeyWriter& keys) {
  keys.u32("context_length", c.max_position_embeddings);
  keys.u32("embedding_length", c.hidden_size);
  keys.u32("block_count", c.num_hidden_layers);
  keys.u32("vocab_size", c.vocab_size);
  keys.u32("feed_forward_length", c.moe.intermediate_size);
  const bool any_kda = std::count(c.layer_types.begin(), c.layer_types.end(), LayerType::Kda) > 0;
  keys.u32("attention.head_count", any_kda ? c.kda.num_heads : c.mla.num_heads);
  std::vector<int64_t> kv;
  for (LayerType t : c.layer_types) kv.push_back(t == LayerType::Kda ? 0 : 1);
  keys.u32_array("attention.head_count_kv", kv);
  keys.f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  const MlaConfig& m = c.mla;
  keys.u32("attention.key_length", m.kv_lora_rank + m.qk_rope_head_dim);
  keys.u32("attention.key_length_mla", m.qk_nope_head_dim + m.qk_rope_head_dim);
  keys.u32("attention.value_length_mla", m.v_head_dim);
  keys.u32("attention.kv_lora_rank", m.kv_lora_rank);
  keys.u32("rope.dimension_count", m.qk_rope_head_dim);
  keys.f32("rope.freq_base", m.rope_theta);
  keys.u32("ssm.conv_kernel", c.kda.conv_kernel);
  keys.u32("kda.head_dim", c.kda.head_dim);
}

void write_gguf_moe(const ModelConfig& c, GgufKeyWriter& keys) {
  const MoeConfig& moe = c.moe;
  keys.u32("expert_count", moe.num_experts);
  keys.u32("expert_used_count", moe.num_experts_per_tok);
  keys.u32("expert_feed_forward_length", moe.moe_intermediate_size);
  keys.u32("expert_shared_count", moe.num_shared_experts);
  keys.u32("leading_dense_block_count", moe.first_k_dense_replace);
  keys.f32("expert_weights_scale", moe.routed_scaling_factor);
  keys.u32("expert_gating_func", 2);
}

void read_gguf_moe(const GgufKeys& keys, ModelConfig& c) {
  const GgufFile& g = keys.file();
  const std::string source = keys.source();
  MoeConfig& moe = c.moe;
  moe.num_experts = keys.integer_or("expert_count", 0);
  HYLA_CHECK(moe.num_experts > 0, "{}: {} is missing or 0; hyla's models are MoE", source, keys.key("expert_count"));
  moe.num_experts_per_tok = keys.uniform("expert_used_count");
  moe.num_shared_experts = keys.integer("expert_shared_count");
  moe.moe_intermediate_size = keys.uniform("expert_feed_forward_length");
  moe.first_k_dense_replace = keys.integer_or("leading_dense_block_count", 0);
  // Checked against the tensors before the layout names an expert: the first MoE layer's router
  // has a row per expert.
  if (moe.first_k_dense_replace >= 0 && moe.first_k_dense_replace < c.num_hidden_layers) {
    const std::string router = fmt::format("blk.{}.ffn_gate_inp.weight", moe.first_k_dense_replace);
    const GgufTensor* r = g.find(router);
    HYLA_CHECK(r && r->ne.size() == 2 && r->ne[1] == moe.num_experts, "{}: {} is {} but {} {}", source,
               keys.key("expert_count"), moe.num_experts, router,
               !r ? std::string("is missing") : fmt::format("has shape {}", Shape(r->ne.begin(), r->ne.end()).str()));
  }
  moe.intermediate_size = keys.has("feed_forward_length") ? keys.uniform("feed_forward_length") : 0;
  if (moe.first_k_dense_replace == 0 && moe.intermediate_size == 0) moe.intermediate_size = moe.moe_intermediate_size;
  const double scale = keys.has("expert_weights_scale") ? keys.number("expert_weights_scale") : 0;
  moe.routed_scaling_factor = scale == 0 ? 1.0 : scale;
  HYLA_CHECK(keys.integer("expert_gating_func") == 2, "{}: {} = {}; SPEC's router is the sigmoid one (2)", source,
             keys.key("expert_gating_func"), keys.integer("expert_gating_func"));
  HYLA_CHECK(keys.integer_or("expert_group_count", 1) <= 1, "{}: grouped routing ({}) is not in SPEC", source,
             keys.key("expert_group_count"));
  moe.router_latent_dim = 0;
}

}  // namespace hyla
