// Kimi Linear (Moonshot AI; 48B total, 3B active): SPEC's layer with the softplus KDA decay gate and
// a rank-head_dim output gate, MLA with NoPE and full-rank q, no output gate, experts at full width
// with SwiGLU, no attention residuals. Hugging Face: model_type "kimi_linear"; llama.cpp: "kimi-linear".
#include "hyla/core/error.h"
#include "hyla/model/arch/kimi_family.h"

namespace hyla {
namespace {

void check(const ModelConfig& c, const Requirement& require) {
  check_kimi(c, require);
  const MoeConfig& moe = c.moe;
  require(c.kda.output_gate_rank == c.kda.head_dim,
          "kimi-linear's KDA output gate is g_b(g_a u) with rank kda.head_dim (kda.output_gate_rank)");
  require(c.kda.gate == KdaGate::Softplus, "kimi-linear's decay gate is the softplus one (kda.gate)");
  require(c.mla.q_lora_rank == 0, "kimi-linear's graph reads q_proj only (mla.q_lora_rank must be 0)");
  require(!c.mla.output_gate, "kimi-linear's MLA has no output gate (mla.output_gate must be false)");
  require(moe.activation == Activation::Swiglu && moe.dense_activation == Activation::Swiglu &&
              moe.shared_activation == Activation::Swiglu,
          "kimi-linear uses SwiGLU in every FFN");
  require(moe.latent_dim == 0, "kimi-linear's experts run at full width (moe.latent_dim must be 0)");
  require(!c.attn_res.enabled, "kimi-linear has no attention residuals (attn_res.enabled must be false)");
}

ModelConfig config_from_hf(const nlohmann::json& file, const std::string& config_path) {
  const nlohmann::json top = without_nulls(file);
  JsonFields root(top, config_path);
  ModelConfig c = kimi_text_config(root, config_path);
  c.architecture = "kimi_linear";
  return c;
}

ModelConfig read_gguf(const GgufKeys& keys) {
  HYLA_CHECK(!keys.has("kda.gate_lower_bound"), "{}: kimi-linear has no kda.gate_lower_bound", keys.source());
  ModelConfig c = read_kimi_gguf(keys);
  c.architecture = "kimi_linear";
  c.kda.output_gate_rank = c.kda.head_dim;
  return c;
}

}  // namespace

extern const Architecture kKimiLinearArchitecture;
const Architecture kKimiLinearArchitecture{
    .name = "kimi_linear",
    .summary = "KDA (softplus decay gate, output gate through rank head_dim) and MLA (NoPE, full-rank q, no output "
               "gate); full-width MoE with SwiGLU and shared experts; no attention residuals",
    .check = check,
    .hf_model_type = "kimi_linear",
    .config_from_hf = config_from_hf,
    .hf_tensor = kimi_hf_tensor,
    .gguf_arch = "kimi-linear",
    .read_gguf = read_gguf,
    .write_gguf = write_kimi_gguf,
    .gguf_tensors = [](const ModelConfig& c) { return kimi_gguf_tensors(c, {1, c.kda.num_heads, 1, 1}); },
};

}  // namespace hyla
