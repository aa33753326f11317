#include "hyla/model/kimi_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "hyla/core/error.h"
#include "hyla/core/half.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/mxfp4_weights.h"
#include "hyla/model/model.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hyla {
namespace {

// hyla's own key for the MLA latent norms' eps (llama.cpp has none: it uses layer_norm_rms_epsilon).
constexpr const char* kLatentNormEps = "attention.latent_norm_rms_epsilon";

// How a GGUF tensor relates to hyla's parameters.
enum class Link {
  Same,     // one parameter, same values and layout (GGUF `ne` is hyla's shape reversed)
  NegExp,   // ssm_a = −exp(A_log)
  Experts,  // ffn_*_exps: the E experts' matrices stacked, expert slowest
  KeyB,     // attn_k_b [H, c, Dn] = kv_b_proj's key rows per head, transposed
  ValueB,   // attn_v_b [H, Dv, c] = kv_b_proj's value rows per head
  Score,    // *_res_score = *_res_query ⊙ *_res_norm.weight
};

struct Mapping {
  std::string gguf;
  std::vector<int64_t> ne;         // as written (fastest first)
  Link link = Link::Same;
  std::vector<std::string> hyla;   // the parameters it holds (Experts: one per expert; Score: query, norm)
  bool matrix = false;             // a matrix-product weight: stored in the export's matrix type
};

struct Dims {
  std::string arch;
  int64_t d, H, K, conv, Hm, Dn, Dr, Dv, c, ql, E, ff_exp, latent, shared_width, ff;
};

// The one place that lists the pairing of names: both directions read it.
std::vector<Mapping> mappings(const ModelConfig& cfg, const std::string& arch) {
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size;
  const KdaConfig& k = cfg.kda;
  const MlaConfig& m = cfg.mla;
  const MoeConfig& moe = cfg.moe;
  const int64_t HK = k.num_heads * k.head_dim, Hm = m.num_heads;
  const int64_t expert_in = moe.latent_dim > 0 ? moe.latent_dim : d;
  const int64_t shared_in = moe.latent_dim > 0 && !moe.shared_full_width ? moe.latent_dim : d;
  const int64_t shared_width = moe.num_shared_experts * moe.moe_intermediate_size;
  const bool k3 = arch == "kimi-k3";
  std::vector<Mapping> out;
  auto add = [&](std::string gguf, std::vector<int64_t> ne, Link link, std::vector<std::string> hyla, bool matrix) {
    out.push_back({std::move(gguf), std::move(ne), link, std::move(hyla), matrix});
  };
  add("token_embd.weight", {d, V}, Link::Same, {"model.embed_tokens.weight"}, true);
  add("output_norm.weight", {d}, Link::Same, {"model.norm.weight"}, false);
  add("output.weight", {d, V}, Link::Same, {cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"},
      true);
  if (cfg.attn_res.enabled)
    add("output_res_score.weight", {d}, Link::Score, {"model.out_res_query", "model.out_res_norm.weight"}, false);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l), p = fmt::format("model.layers.{}.", l);
    const std::string a = p + "self_attn.", f = p + "mlp.";
    add(b + "attn_norm.weight", {d}, Link::Same, {p + "input_layernorm.weight"}, false);
    add(b + "ffn_norm.weight", {d}, Link::Same, {p + "post_attention_layernorm.weight"}, false);
    if (cfg.attn_res.enabled) {
      add(b + "attn_res_score.weight", {d}, Link::Score, {p + "attn_res_query", p + "attn_res_norm.weight"}, false);
      add(b + "ffn_res_score.weight", {d}, Link::Score, {p + "mlp_res_query", p + "mlp_res_norm.weight"}, false);
    }
    if (!cfg.is_attention_layer(l)) {
      for (const char* x : {"q", "k", "v"}) {
        add(b + fmt::format("attn_{}.weight", x), {d, HK}, Link::Same, {a + fmt::format("{}_proj.weight", x)}, true);
        add(b + fmt::format("ssm_conv1d_{}.weight", x), {k.conv_kernel, 1, HK, 1}, Link::Same,
            {a + fmt::format("{}_conv1d.weight", x)}, false);
      }
      add(b + "ssm_f_a.weight", {d, k.gate_rank}, Link::Same, {a + "f_a_proj.weight"}, true);
      add(b + "ssm_f_b.weight", {k.gate_rank, HK}, Link::Same, {a + "f_b_proj.weight"}, true);
      add(b + "ssm_beta.weight", {d, k.num_heads}, Link::Same, {a + "b_proj.weight"}, true);
      add(b + "ssm_a", k3 ? std::vector<int64_t>{k.num_heads} : std::vector<int64_t>{1, k.num_heads, 1, 1}, Link::NegExp,
          {a + "A_log"}, false);
      add(b + "ssm_dt.bias", {HK}, Link::Same, {a + "dt_bias"}, false);
      if (k.output_gate_rank == 0) {
        add(b + "ssm_g.weight", {d, HK}, Link::Same, {a + "g_proj.weight"}, true);
      } else {
        add(b + "ssm_g_a.weight", {d, k.output_gate_rank}, Link::Same, {a + "g_a_proj.weight"}, true);
        add(b + "ssm_g_b.weight", {k.output_gate_rank, HK}, Link::Same, {a + "g_b_proj.weight"}, true);
      }
      add(b + "ssm_norm.weight", {k.head_dim}, Link::Same, {a + "o_norm.weight"}, false);
      add(b + "attn_output.weight", {HK, d}, Link::Same, {a + "o_proj.weight"}, true);
    } else {
      const int64_t dq = Hm * (m.qk_nope_head_dim + m.qk_rope_head_dim);
      if (m.q_lora_rank == 0) {
        add(b + "attn_q.weight", {d, dq}, Link::Same, {a + "q_proj.weight"}, true);
      } else {
        add(b + "attn_q_a.weight", {d, m.q_lora_rank}, Link::Same, {a + "q_a_proj.weight"}, true);
        add(b + "attn_q_a_norm.weight", {m.q_lora_rank}, Link::Same, {a + "q_a_layernorm.weight"}, false);
        add(b + "attn_q_b.weight", {m.q_lora_rank, dq}, Link::Same, {a + "q_b_proj.weight"}, true);
      }
      add(b + "attn_kv_a_mqa.weight", {d, m.kv_lora_rank + m.qk_rope_head_dim}, Link::Same,
          {a + "kv_a_proj_with_mqa.weight"}, true);
      add(b + "attn_kv_a_norm.weight", {m.kv_lora_rank}, Link::Same, {a + "kv_a_layernorm.weight"}, false);
      add(b + "attn_k_b.weight", {m.qk_nope_head_dim, m.kv_lora_rank, Hm}, Link::KeyB, {a + "kv_b_proj.weight"}, true);
      add(b + "attn_v_b.weight", {m.kv_lora_rank, m.v_head_dim, Hm}, Link::ValueB, {a + "kv_b_proj.weight"}, true);
      if (m.output_gate) add(b + "attn_gate.weight", {d, Hm * m.v_head_dim}, Link::Same, {a + "g_proj.weight"}, true);
      add(b + "attn_output.weight", {Hm * m.v_head_dim, d}, Link::Same, {a + "o_proj.weight"}, true);
    }
    if (!cfg.is_moe_layer(l)) {
      for (const char* x : {"gate", "up"})
        add(b + fmt::format("ffn_{}.weight", x), {d, moe.intermediate_size}, Link::Same,
            {f + fmt::format("{}_proj.weight", x)}, true);
      add(b + "ffn_down.weight", {moe.intermediate_size, d}, Link::Same, {f + "down_proj.weight"}, true);
      continue;
    }
    add(b + "ffn_gate_inp.weight", {d, moe.num_experts}, Link::Same, {f + "gate.weight"}, false);
    add(b + "exp_probs_b.bias", {moe.num_experts}, Link::Same, {f + "gate.e_score_correction_bias"}, false);
    for (const char* x : {"gate", "up", "down"}) {
      std::vector<std::string> experts;
      for (int64_t e = 0; e < moe.num_experts; ++e) experts.push_back(f + fmt::format("experts.{}.{}_proj.weight", e, x));
      const bool down = std::string(x) == "down";
      add(b + fmt::format("ffn_{}_exps.weight", x),
          down ? std::vector<int64_t>{moe.moe_intermediate_size, expert_in, moe.num_experts}
               : std::vector<int64_t>{expert_in, moe.moe_intermediate_size, moe.num_experts},
          Link::Experts, experts, true);
    }
    if (moe.latent_dim > 0) {
      add(b + "ffn_routed_down.weight", {d, moe.latent_dim}, Link::Same, {f + "lat_down.weight"}, true);
      if (moe.latent_norm) add(b + "ffn_routed_norm.weight", {moe.latent_dim}, Link::Same, {f + "lat_norm.weight"}, false);
      add(b + "ffn_routed_up.weight", {moe.latent_dim, d}, Link::Same, {f + "lat_up.weight"}, true);
    }
    if (moe.num_shared_experts > 0) {
      for (const char* x : {"gate", "up"})
        add(b + fmt::format("ffn_{}_shexp.weight", x), {shared_in, shared_width}, Link::Same,
            {f + fmt::format("shared_experts.{}_proj.weight", x)}, true);
      add(b + "ffn_down_shexp.weight", {shared_width, shared_in}, Link::Same, {f + "shared_experts.down_proj.weight"},
          true);
    }
  }
  return out;
}

std::vector<int64_t> without_trailing_ones(std::vector<int64_t> ne) {
  while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
  return ne;
}

std::string key(const std::string& arch, const std::string& name) { return arch + "." + name; }

// The dtype a tensor of `type` is read as: its own for F32, F16 and BF16 (a view of the file), else
// f32 (dequantised).
DType read_dtype(uint32_t type) {
  switch (GgmlType(type)) {
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    default: return DType::F32;
  }
}

// Values [first, first + shape.numel()) of `t`, as read_dtype(t.type) says.
Tensor slice(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape) {
  const GgmlType type = GgmlType(t.type);
  const uint8_t* p = g.data(t) + ggml_bytes(type, first);
  const bool stored_as_read = type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
  const DType dtype = read_dtype(t.type);
  if (stored_as_read && reinterpret_cast<uintptr_t>(p) % dtype_size(dtype) == 0)
    return Tensor::view(dtype, shape, const_cast<uint8_t*>(p), g.mapped(t));
  Tensor out = Tensor::empty(DType::F32, shape);
  g.decode(t, first, shape.numel(), out.data<float>());
  return out;
}

// The int8 codes and f32 scales of Q8_0 rows (hyla's int8 layout with block 32: the same numbers).
Tensor ones(const Shape& shape) {
  Tensor t = Tensor::empty(DType::F32, shape);
  std::fill_n(t.data<float>(), shape.numel(), 1.0f);
  return t;
}

Tensor q8_0_codes(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape) {
  const uint8_t* p = g.data(t) + ggml_bytes(GgmlType::Q8_0, first);
  Tensor out = Tensor::empty(DType::I8, shape);
  for (int64_t b = 0; b < shape.numel() / 32; ++b) std::memcpy(out.data<int8_t>() + b * 32, p + b * 34 + 2, 32);
  return out;
}

Tensor q8_0_scales(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape) {
  const uint8_t* p = g.data(t) + ggml_bytes(GgmlType::Q8_0, first);
  Tensor out = Tensor::empty(DType::F32, shape);
  for (int64_t b = 0; b < shape.numel(); ++b) {
    f16 d;
    std::memcpy(&d, p + b * 34, 2);
    out.data<float>()[b] = to_f32(d);
  }
  return out;
}

// The weights that keep a stored form (Q8_0 as int8 with block 32, MXFP4 as MXFP4, any quantised
// type as its blocks): stored as a type `stored` accepts, allowed it by the model (`allowed`), and
// every weight that runs in the same kernel alike (Param::stored_like_next).
std::set<std::string> kept_as(const GgufFile& g, const ModelConfig& config, const std::vector<Mapping>& maps,
                              bool (*stored_as)(GgmlType), bool (*allowed)(const Param&)) {
  std::set<std::string> stored;
  for (const Mapping& m : maps) {
    const GgufTensor* t = g.find(m.gguf);
    if (t && stored_as(GgmlType(t->type)) && (m.link == Link::Same || m.link == Link::Experts))
      stored.insert(m.hyla.begin(), m.hyla.end());
  }
  Model layout(config, /*allocate=*/false);
  const auto& params = layout.params().params();
  std::set<std::string> out;
  for (size_t i = 0; i < params.size();) {
    size_t end = i + 1;
    while (end < params.size() && params[end - 1]->stored_like_next) ++end;
    bool ok = true;
    for (size_t j = i; j < end; ++j) ok &= allowed(*params[j]) && stored.count(params[j]->name) > 0;
    for (size_t j = i; ok && j < end; ++j) out.insert(params[j]->name);
    i = end;
  }
  return out;
}

// The E2M1 codes [rows, cols / 2] and E8M0 scales [rows, cols / 32] of MXFP4 rows (mxfp4_weights.h).
Tensor mxfp4_part(const GgufFile& g, const GgufTensor& t, int64_t first, const Shape& shape, bool scales) {
  const int64_t rows = shape[0], cols = shape[1];
  Tensor codes = Tensor::empty(DType::U8, {rows, cols / 2}), scale = Tensor::empty(DType::U8, {rows, cols / 32});
  mxfp4_blocks_to_codes(g.data(t) + ggml_bytes(GgmlType::MXFP4, first), rows * cols, codes.data<uint8_t>(),
                        scale.data<uint8_t>());
  return scales ? scale : codes;
}

}  // namespace

bool is_gguf_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

std::string kimi_gguf_arch(const ModelConfig& c) {
  const MoeConfig& moe = c.moe;
  const bool k3 = c.attn_res.enabled || moe.latent_dim > 0 || moe.activation == Activation::Situ ||
                  c.mla.output_gate || c.kda.output_gate_rank == 0;
  const std::string arch = k3 ? "kimi-k3" : "kimi-linear";
  auto require = [&](bool ok, std::string_view what) {
    HYLA_CHECK(ok, "this config cannot be written as a llama.cpp {} GGUF: {}", arch, what);
  };
  bool kda = false, mla = false;
  for (LayerType t : c.layer_types) {
    require(t != LayerType::Swa, "llama.cpp has no sliding-window (\"swa\") layers");
    kda |= t == LayerType::Kda, mla |= t == LayerType::Mla;
  }
  require(!kda || !mla || c.kda.num_heads == c.mla.num_heads,
          "llama.cpp has one head count for KDA and MLA layers (kda.num_heads must equal mla.num_heads)");
  require(c.kda.gate_rank == c.kda.head_dim, "llama.cpp's decay gate is f_b(f_a u) with rank kda.head_dim (kda.gate_rank)");
  require(!mla || !c.mla.rope || c.mla.qk_rope_head_dim == 0, "llama.cpp never rotates q_pe/k_pe (mla.rope must be false)");
  require(c.mla.sliding_window == 0, "mla.sliding_window must be 0");
  // MoonViT stays out of the text GGUF (as llama.cpp's converter leaves it out); hyla's own patch
  // embedding has no llama.cpp graph at all.
  require(!c.vision.enabled || c.vision.tower == VisionTower::MoonVit,
          "llama.cpp's graphs read no images through hyla's patch embedding (vision.enabled)");
  require(moe.router_latent_dim == 0, "llama.cpp's router is σ(W_r u) (moe.router_latent_dim must be 0)");
  require(moe.num_experts <= 1024, "llama.cpp allows at most 1024 experts");
  if (k3) {
    require(c.kda.output_gate_rank == 0, "kimi-k3's KDA output gate is full rank (kda.output_gate_rank must be 0)");
    require(moe.activation == Activation::Situ && moe.dense_activation == Activation::Situ &&
                (moe.num_shared_experts == 0 || moe.shared_activation == Activation::Situ),
            "kimi-k3 uses SiTU in every FFN (moe.activation, dense_activation, shared_activation)");
    require(moe.latent_dim == 0 || moe.num_shared_experts == 0 || moe.shared_full_width,
            "kimi-k3's shared experts read u at full width (moe.shared_full_width)");
  } else {
    require(c.kda.output_gate_rank == c.kda.head_dim,
            "kimi-linear's KDA output gate is g_b(g_a u) with rank kda.head_dim (kda.output_gate_rank)");
    require(c.kda.gate == KdaGate::Softplus, "kimi-linear's decay gate is the softplus one (kda.gate)");
    require(c.mla.q_lora_rank == 0, "kimi-linear's graph reads q_proj only (mla.q_lora_rank must be 0)");
    require(moe.dense_activation == Activation::Swiglu && moe.shared_activation == Activation::Swiglu,
            "kimi-linear uses SwiGLU in every FFN");
  }
  return arch;
}

ModelConfig config_from_gguf(const GgufFile& g) {
  const std::string source = g.path().string();
  const std::string arch = g.string("general.architecture");
  HYLA_CHECK(arch == "kimi-k3" || arch == "kimi-linear",
             "{}: architecture '{}'; hyla reads llama.cpp's kimi-k3 and kimi-linear GGUF files", source, arch);
  const bool k3 = arch == "kimi-k3";
  auto integer = [&](const std::string& name) { return g.integer(key(arch, name)); };
  auto uniform = [&](const std::string& name) {
    const std::vector<int64_t> v = g.integers(key(arch, name));
    for (int64_t x : v)
      HYLA_CHECK(x == v[0], "{}: {} differs between layers; SPEC has one value", source, key(arch, name));
    return v.at(0);
  };
  auto optional_integer = [&](const std::string& name, int64_t otherwise) {
    return g.has(key(arch, name)) ? integer(name) : otherwise;
  };
  ModelConfig c;
  c.hidden_size = integer("embedding_length");
  c.num_hidden_layers = integer("block_count");
  // Checked against the tensors before anything is sized from it: every layer has its attn_norm.
  const int64_t layers_held = std::count_if(g.tensors().begin(), g.tensors().end(), [](const GgufTensor& t) {
    return t.name.starts_with("blk.") && t.name.ends_with(".attn_norm.weight");
  });
  HYLA_CHECK(c.num_hidden_layers >= 1 && c.num_hidden_layers == layers_held,
             "{}: {} is {} but the file holds {} layers' tensors (blk.N.attn_norm.weight)", source,
             key(arch, "block_count"), c.num_hidden_layers, layers_held);
  c.max_position_embeddings = integer("context_length");
  c.rms_norm_eps = g.number(key(arch, "attention.layer_norm_rms_epsilon"));
  c.vocab_size = g.tensor("token_embd.weight").ne.at(1);
  HYLA_CHECK(!g.has(key(arch, "vocab_size")) || integer("vocab_size") == c.vocab_size,
             "{}: {} = {} but token_embd.weight has {} rows", source, key(arch, "vocab_size"), integer("vocab_size"),
             c.vocab_size);
  c.tie_word_embeddings = false;
  const std::vector<int64_t> kv_heads = g.integers(key(arch, "attention.head_count_kv"));
  HYLA_CHECK(int64_t(kv_heads.size()) == c.num_hidden_layers, "{}: {} lists {} layers, block_count is {}", source,
             key(arch, "attention.head_count_kv"), kv_heads.size(), c.num_hidden_layers);
  c.layer_types.clear();
  for (int64_t h : kv_heads) c.layer_types.push_back(h == 0 ? LayerType::Kda : LayerType::Mla);
  const int64_t heads = uniform("attention.head_count");

  KdaConfig& kda = c.kda;
  kda.num_heads = heads;
  kda.head_dim = integer("kda.head_dim");
  kda.conv_kernel = integer("ssm.conv_kernel");
  kda.chunk_size = KdaConfig{}.chunk_size;
  if (g.has(key(arch, "kda.gate_lower_bound"))) {
    HYLA_CHECK(k3, "{}: kimi-linear has no kda.gate_lower_bound", source);
    kda.gate = KdaGate::LowerBound;
    kda.gate_lower_bound = g.number(key(arch, "kda.gate_lower_bound"));
  } else {
    kda.gate = KdaGate::Softplus;
  }
  kda.gate_rank = kda.head_dim;
  kda.output_gate_rank = k3 ? 0 : kda.head_dim;

  MlaConfig& mla = c.mla;
  mla.num_heads = heads;
  mla.q_lora_rank = k3 ? optional_integer("attention.q_lora_rank", 0) : 0;
  mla.kv_lora_rank = integer("attention.kv_lora_rank");
  const int64_t key_length = integer("attention.key_length_mla");
  mla.v_head_dim = integer("attention.value_length_mla");
  mla.rope = false;
  mla.qk_rope_head_dim = optional_integer("rope.dimension_count", 0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_attention_layer(l)) {  // the tensor's width is what the graph uses
      mla.qk_rope_head_dim = g.tensor(fmt::format("blk.{}.attn_kv_a_mqa.weight", l)).ne.at(1) - mla.kv_lora_rank;
      mla.output_gate = k3 && g.find(fmt::format("blk.{}.attn_gate.weight", l)) != nullptr;
      if (k3 && g.find(fmt::format("blk.{}.attn_q_a.weight", l)) == nullptr) mla.q_lora_rank = 0;
      break;
    }
  mla.qk_nope_head_dim = key_length - mla.qk_rope_head_dim;
  HYLA_CHECK(mla.qk_nope_head_dim >= 0, "{}: attention.key_length_mla {} is less than the rope width {}", source,
             key_length, mla.qk_rope_head_dim);
  if (g.has(key(arch, "rope.freq_base"))) mla.rope_theta = g.number(key(arch, "rope.freq_base"));
  // llama.cpp's graph uses layer_norm_rms_epsilon for the latent norms too; hyla's key (written
  // only where the two differ) says when the model was made with another.
  mla.norm_eps = g.has(key(arch, kLatentNormEps)) ? g.number(key(arch, kLatentNormEps)) : c.rms_norm_eps;
  mla.sliding_window = 0;

  MoeConfig& moe = c.moe;
  moe.num_experts = optional_integer("expert_count", 0);
  HYLA_CHECK(moe.num_experts > 0, "{}: {} is missing or 0; hyla's models are MoE", source, key(arch, "expert_count"));
  moe.num_experts_per_tok = uniform("expert_used_count");
  moe.num_shared_experts = integer("expert_shared_count");
  moe.moe_intermediate_size = uniform("expert_feed_forward_length");
  moe.first_k_dense_replace = optional_integer("leading_dense_block_count", 0);
  // Checked against the tensors before the layout names an expert: the first MoE layer's router
  // has a row per expert.
  if (moe.first_k_dense_replace >= 0 && moe.first_k_dense_replace < c.num_hidden_layers) {
    const std::string router = fmt::format("blk.{}.ffn_gate_inp.weight", moe.first_k_dense_replace);
    const GgufTensor* r = g.find(router);
    HYLA_CHECK(r && r->ne.size() == 2 && r->ne[1] == moe.num_experts, "{}: {} is {} but {} {}", source,
               key(arch, "expert_count"), moe.num_experts, router,
               !r ? std::string("is missing") : fmt::format("has shape {}", Shape(r->ne.begin(), r->ne.end()).str()));
  }
  moe.intermediate_size = g.has(key(arch, "feed_forward_length")) ? uniform("feed_forward_length") : 0;
  if (moe.first_k_dense_replace == 0 && moe.intermediate_size == 0) moe.intermediate_size = moe.moe_intermediate_size;
  const double scale = g.has(key(arch, "expert_weights_scale")) ? g.number(key(arch, "expert_weights_scale")) : 0;
  moe.routed_scaling_factor = scale == 0 ? 1.0 : scale;
  HYLA_CHECK(integer("expert_gating_func") == 2, "{}: {} = {}; SPEC's router is the sigmoid one (2)", source,
             key(arch, "expert_gating_func"), integer("expert_gating_func"));
  HYLA_CHECK(optional_integer("expert_group_count", 1) <= 1, "{}: grouped routing ({}) is not in SPEC", source,
             key(arch, "expert_group_count"));
  if (k3)
    HYLA_CHECK(g.has(key(arch, "expert_weights_norm")) && g.boolean(key(arch, "expert_weights_norm")),
               "{}: {} is not true; SPEC always renormalises the top-k weights", source, key(arch, "expert_weights_norm"));
  moe.router_latent_dim = 0;
  moe.latent_dim = k3 ? optional_integer("expert_latent_length", 0) : 0;
  const Activation act = k3 ? Activation::Situ : Activation::Swiglu;
  moe.activation = moe.dense_activation = moe.shared_activation = act;
  if (k3) {
    moe.situ_beta = g.number(key(arch, "activation.situ_beta"));
    moe.situ_linear_beta = g.number(key(arch, "activation.situ_linear_beta"));
  }
  moe.shared_full_width = k3 && moe.latent_dim > 0;
  // ffn_routed_norm is optional in llama.cpp's graph, which then skips the norm: so does SPEC
  // (moe.latent_norm false). Its first MoE layer says for all; the others must agree (tensor check).
  moe.latent_norm =
      moe.latent_dim == 0 || g.find(fmt::format("blk.{}.ffn_routed_norm.weight", moe.first_k_dense_replace)) != nullptr;

  const int64_t block = k3 ? integer("attn_res.block_size") : 0;
  c.attn_res.enabled = block > 0;
  c.attn_res.block_size = block > 0 ? block : AttnResConfig{}.block_size;
  c.vision.enabled = false;
  c.validate(source);
  HYLA_CHECK(kimi_gguf_arch(c) == arch, "{}: reads as a {} config", source, kimi_gguf_arch(c));
  return c;
}

ModelWeights weights_from_gguf(std::shared_ptr<const GgufFile> gguf, const ModelConfig& config, GgufQuantized quantized) {
  const GgufFile& g = *gguf;
  const std::string source = g.path().string();
  const std::string arch = kimi_gguf_arch(config);
  HYLA_CHECK(g.string("general.architecture") == arch, "{}: a {} file, but the config is {}", source,
             g.string("general.architecture"), arch);
  ModelWeights w;
  for (const auto& file : g.mapped_files()) w.keep_mapped(file);
  const std::vector<Mapping> maps = mappings(config, arch);
  const auto matrix = [](const Param& p) { return p.int8_allowed; };
  const std::set<std::string> int8 =
      quantized != GgufQuantized::Decoded
          ? kept_as(g, config, maps, [](GgmlType t) { return t == GgmlType::Q8_0; }, matrix)
          : std::set<std::string>{};
  const std::set<std::string> mxfp4 = kept_as(
      g, config, maps, [](GgmlType t) { return t == GgmlType::MXFP4; }, [](const Param& p) { return p.mxfp4_allowed(); });
  std::set<std::string> blocks;
  if (quantized == GgufQuantized::InPlace)
    for (const std::string& name : kept_as(g, config, maps, ggml_type_quantized, matrix))
      if (!int8.count(name) && !mxfp4.count(name)) blocks.insert(name);
  const auto int8_meta = std::make_shared<const std::map<std::string, std::string>>(int8_metadata(32));
  // A Q8_0 matrix kept as int8: its codes and, beside them, its scales.
  auto add_int8 = [&](const std::string& name, const GgufTensor* t, int64_t first, const Shape& shape) {
    const Shape scales{shape[0], shape[1] / 32};
    const MappedBytes bytes{gguf->mapped(*t), gguf->data(*t) + ggml_bytes(GgmlType::Q8_0, first),
                            size_t(ggml_bytes(GgmlType::Q8_0, shape.numel()))};
    w.add({name, DType::I8, shape, 0, uint64_t(shape.numel())}, source,
          [gguf, t, first, shape] { return q8_0_codes(*gguf, *t, first, shape); }, int8_meta, bytes);
    w.add({int8_scale_name(name), DType::F32, scales, 0, uint64_t(scales.numel()) * 2}, source,
          [gguf, t, first, scales] { return q8_0_scales(*gguf, *t, first, scales); }, int8_meta, bytes);
  };
  // An MXFP4 expert matrix kept as MXFP4: its codes and scales.
  auto add_mxfp4 = [&](const std::string& name, const GgufTensor* t, int64_t first, const Shape& shape) {
    const Shape codes{shape[0], shape[1] / 2}, scales{shape[0], shape[1] / 32};
    const MappedBytes bytes{gguf->mapped(*t), gguf->data(*t) + ggml_bytes(GgmlType::MXFP4, first),
                            size_t(ggml_bytes(GgmlType::MXFP4, shape.numel())), GgmlType::MXFP4};
    w.add({name, DType::U8, codes, 0, uint64_t(codes.numel())}, source,
          [gguf, t, first, shape] { return mxfp4_part(*gguf, *t, first, shape, /*scales=*/false); }, nullptr, bytes);
    w.add({mxfp4_scale_name(name), DType::U8, scales, 0, uint64_t(scales.numel())}, source,
          [gguf, t, first, shape] { return mxfp4_part(*gguf, *t, first, shape, /*scales=*/true); }, nullptr, bytes);
  };
  // A matrix kept as its blocks: the rows of blocks as they lie in the map.
  auto add_blocks = [&](const std::string& name, const GgufTensor* t, int64_t first, const Shape& shape) {
    const GgmlType type = GgmlType(t->type);
    const int64_t row_bytes = int64_t(ggml_bytes(type, shape[1]));
    const uint8_t* begin = gguf->data(*t) + ggml_bytes(type, first);
    const MappedBytes bytes{gguf->mapped(*t), begin, size_t(row_bytes * shape[0]), type};
    w.add({name, DType::U8, {shape[0], row_bytes}, 0, uint64_t(row_bytes * shape[0])}, source,
          [gguf, t, begin, rows = shape[0], row_bytes] {
            return Tensor::view(DType::U8, {rows, row_bytes}, const_cast<uint8_t*>(begin), gguf->mapped(*t));
          }, nullptr, bytes);
  };
  std::set<std::string> used;
  auto entry = [](const std::string& name, DType dtype, Shape shape, uint64_t bytes) {
    return SafetensorsEntry{name, dtype, shape, 0, bytes};
  };
  for (const Mapping& m : maps) {
    const GgufTensor* t = g.find(m.gguf);
    HYLA_CHECK(t, "{}: missing tensor '{}' (for '{}')", source, m.gguf, m.hyla[0]);
    used.insert(m.gguf);
    const bool alternate_a = m.link == Link::NegExp && without_trailing_ones(t->ne) == std::vector<int64_t>{1, m.ne[1]};
    HYLA_CHECK(without_trailing_ones(t->ne) == without_trailing_ones(m.ne) || alternate_a,
               "{}: tensor '{}' has ne [{}] but the config needs [{}]", source, m.gguf, fmt::join(t->ne, ", "),
               fmt::join(m.ne, ", "));
    switch (m.link) {
      case Link::Same: {
        if (config.tie_word_embeddings && m.gguf == "output.weight") break;
        std::vector<int64_t> ne = m.ne;
        if (ne.size() == 4) ne.pop_back();  // the convs: {kernel, 1, H·K, 1} is hyla's [H·K, 1, kernel]
        const Shape shape(ne.rbegin(), ne.rend());
        if (int8.count(m.hyla[0])) {
          add_int8(m.hyla[0], t, 0, shape);
          break;
        }
        if (blocks.count(m.hyla[0])) {
          add_blocks(m.hyla[0], t, 0, shape);
          break;
        }
        const DType dtype = read_dtype(t->type);
        w.add(entry(m.hyla[0], dtype, shape, t->bytes), source, [gguf, t, shape] { return slice(*gguf, *t, 0, shape); });
        break;
      }
      case Link::NegExp: {
        const Shape shape{config.kda.num_heads};
        w.add(entry(m.hyla[0], DType::F32, shape, t->bytes), source, [gguf, t, shape, source, name = m.gguf] {
          Tensor a = gguf->to_f32(*t), out = Tensor::empty(DType::F32, shape);
          for (int64_t h = 0; h < shape[0]; ++h) {
            const float x = a.data<float>()[h];
            HYLA_CHECK(x < 0 && std::isfinite(x), "{}: tensor '{}' holds {} at head {}; −exp(A_log) is negative", source,
                       name, x, h);
            out.data<float>()[h] = float(std::log(-double(x)));
          }
          return out;
        });
        break;
      }
      case Link::Experts: {
        const int64_t per = m.ne[0] * m.ne[1];
        const Shape shape{m.ne[1], m.ne[0]};
        const DType dtype = read_dtype(t->type);
        for (size_t e = 0; e < m.hyla.size(); ++e)
          if (int8.count(m.hyla[e])) add_int8(m.hyla[e], t, int64_t(e) * per, shape);
          else if (mxfp4.count(m.hyla[e])) add_mxfp4(m.hyla[e], t, int64_t(e) * per, shape);
          else if (blocks.count(m.hyla[e])) add_blocks(m.hyla[e], t, int64_t(e) * per, shape);
          else w.add(entry(m.hyla[e], dtype, shape, t->bytes / m.hyla.size()), source,
                [gguf, t, shape, first = int64_t(e) * per] { return slice(*gguf, *t, first, shape); });
        break;
      }
      case Link::KeyB: {  // kv_b_proj from attn_k_b and attn_v_b together
        const MlaConfig& mc = config.mla;
        const int64_t H = mc.num_heads, Dn = mc.qk_nope_head_dim, Dv = mc.v_head_dim, c = mc.kv_lora_rank;
        const std::string vname = m.gguf.substr(0, m.gguf.size() - std::string("attn_k_b.weight").size()) + "attn_v_b.weight";
        const GgufTensor* vt = g.find(vname);
        HYLA_CHECK(vt, "{}: missing tensor '{}' (for '{}')", source, vname, m.hyla[0]);
        const Shape shape{H * (Dn + Dv), c};
        w.add(entry(m.hyla[0], DType::F32, shape, t->bytes + vt->bytes), source, [gguf, t, vt, shape, H, Dn, Dv, c] {
          const Tensor kb = gguf->to_f32(*t), vb = gguf->to_f32(*vt);  // [H, c, Dn], [H, Dv, c]
          Tensor out = Tensor::empty(DType::F32, shape);
          float* o = out.data<float>();
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < Dn; ++i)
              for (int64_t j = 0; j < c; ++j) o[(h * (Dn + Dv) + i) * c + j] = kb.data<float>()[(h * c + j) * Dn + i];
            std::memcpy(o + (h * (Dn + Dv) + Dn) * c, vb.data<float>() + h * Dv * c, size_t(Dv * c) * 4);
          }
          return out;
        });
        break;
      }
      case Link::ValueB: break;  // read with attn_k_b
      case Link::Score: {
        const Shape shape{config.hidden_size};
        w.add(entry(m.hyla[0], DType::F32, shape, t->bytes), source, [gguf, t] { return gguf->to_f32(*t); });
        w.add(entry(m.hyla[1], DType::F32, shape, 0), source, [shape] { return ones(shape); });
        break;
      }
    }
  }
  for (const GgufTensor& t : g.tensors())
    HYLA_CHECK(used.count(t.name), "{}: tensor '{}' is not part of this {} model (its config reads as {} layers, {} experts)",
               source, t.name, arch, config.num_hidden_layers, config.moe.num_experts);
  return w;
}

GgufExport save_kimi_gguf(const fs::path& path, const ModelConfig& c, const ModelWeights& weights,
                           const GgufExportOptions& options) {
  const std::string arch = kimi_gguf_arch(c);
  const bool k3 = arch == "kimi-k3";
  HYLA_CHECK(options.matrices != GgmlType::MXFP4,
             "{}: MXFP4 is written only from MXFP4 experts (hyla quantize --experts mxfp4), which keep it whatever "
             "the type of the other matrices", path.string());
  GgufMetadata meta;
  auto u32 = [&](const std::string& name, int64_t v) { meta[key(arch, name)] = GgufValue::u32(uint32_t(v)); };
  auto f32 = [&](const std::string& name, double v) { meta[key(arch, name)] = GgufValue::f32(float(v)); };
  meta["general.architecture"] = GgufValue::string(arch);
  meta["general.name"] = GgufValue::string(options.name);
  const std::map<GgmlType, int64_t> file_type = {
      {GgmlType::F32, 0}, {GgmlType::F16, 1}, {GgmlType::Q8_0, 7}, {GgmlType::BF16, 32}};
  meta["general.file_type"] = GgufValue::u32(uint32_t(file_type.at(options.matrices)));
  u32("context_length", c.max_position_embeddings);
  u32("embedding_length", c.hidden_size);
  u32("block_count", c.num_hidden_layers);
  u32("vocab_size", c.vocab_size);
  u32("feed_forward_length", c.moe.intermediate_size);
  const bool any_kda = std::count(c.layer_types.begin(), c.layer_types.end(), LayerType::Kda) > 0;
  u32("attention.head_count", any_kda ? c.kda.num_heads : c.mla.num_heads);
  json kv = json::array();
  for (LayerType t : c.layer_types) kv.push_back(t == LayerType::Kda ? 0 : 1);
  meta[key(arch, "attention.head_count_kv")] = GgufValue::of_array(GgufValueType::U32, kv);
  f32("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  if (c.mla.norm_eps != c.rms_norm_eps) f32(kLatentNormEps, c.mla.norm_eps);
  const MlaConfig& m = c.mla;
  u32("attention.key_length", m.kv_lora_rank + m.qk_rope_head_dim);
  if (k3) u32("attention.value_length", m.kv_lora_rank);
  u32("attention.key_length_mla", m.qk_nope_head_dim + m.qk_rope_head_dim);
  u32("attention.value_length_mla", m.v_head_dim);
  if (k3 && m.q_lora_rank > 0) u32("attention.q_lora_rank", m.q_lora_rank);
  u32("attention.kv_lora_rank", m.kv_lora_rank);
  u32("rope.dimension_count", m.qk_rope_head_dim);
  f32("rope.freq_base", m.rope_theta);
  u32("ssm.conv_kernel", c.kda.conv_kernel);
  u32("kda.head_dim", c.kda.head_dim);
  if (k3 && c.kda.gate == KdaGate::LowerBound) f32("kda.gate_lower_bound", c.kda.gate_lower_bound);
  const MoeConfig& moe = c.moe;
  u32("expert_count", moe.num_experts);
  u32("expert_used_count", moe.num_experts_per_tok);
  u32("expert_feed_forward_length", moe.moe_intermediate_size);
  u32("expert_shared_count", moe.num_shared_experts);
  u32("leading_dense_block_count", moe.first_k_dense_replace);
  f32("expert_weights_scale", moe.routed_scaling_factor);
  if (k3) meta[key(arch, "expert_weights_norm")] = GgufValue::boolean(true);
  u32("expert_gating_func", 2);
  if (k3) {
    if (moe.latent_dim > 0) u32("expert_latent_length", moe.latent_dim);
    u32("attn_res.block_size", c.attn_res.enabled ? c.attn_res.block_size : 0);
    f32("activation.situ_beta", moe.situ_beta);
    f32("activation.situ_linear_beta", moe.situ_linear_beta);
  }
  // Without a vocabulary llama.cpp keeps vocab_size dummy tokens and runs on token ids.
  meta["tokenizer.ggml.model"] = GgufValue::string("none");
  for (const auto& [k, v] : options.tokenizer) meta[k] = v;

  const std::vector<Mapping> maps = mappings(c, arch);
  std::vector<GgufTensor> tensors;
  // MXFP4 experts stay MXFP4 (only bits move): the expert tensors of a layer take their format.
  const auto is_mxfp4 = [&](const Mapping& mp) {
    return mp.link == Link::Experts && weights.entry(mp.hyla[0]).dtype == DType::U8;
  };
  bool any_mxfp4 = false;
  for (const Mapping& mp : maps) {
    GgmlType type = mp.matrix ? options.matrices : GgmlType::F32;
    if (mp.ne[0] % ggml_block_values(type) != 0) type = GgmlType::F32;  // Q8_0 needs rows of whole blocks
    if (is_mxfp4(mp)) type = GgmlType::MXFP4, any_mxfp4 = true;
    tensors.push_back({mp.gguf, mp.ne, uint32_t(type), 0, 0});
  }
  // llama.cpp's LLAMA_FTYPE_MOSTLY_MXFP4_MOE (38) names a file whose experts are MXFP4.
  if (any_mxfp4) meta["general.file_type"] = GgufValue::u32(38);
  GgufWriter writer(path, meta, tensors, options.split_max_bytes);
  std::vector<uint8_t> bytes;
  auto write_f32 = [&](const GgufTensor& t, const float* data, int64_t n) {
    bytes.resize(ggml_bytes(GgmlType(t.type), n));
    f32_to_ggml(GgmlType(t.type), data, bytes.data(), n);
    writer.write(bytes.data(), bytes.size());
  };
  auto read_f32 = [&](const std::string& name) {
    HYLA_CHECK(weights.entry(name).dtype != DType::I8 && weights.entry(name).dtype != DType::U8,
               "{}: tensor '{}' is {}; a GGUF is written from floating-point weights (the model before hyla quantize; "
               "MXFP4 experts are the exception, all of a layer's)",
               weights.file_of(name), name, weights.entry(name).dtype == DType::I8 ? "int8" : "MXFP4");
    const Tensor t = weights.get(name);
    return t.dtype() == DType::F32 ? t : t.to(DType::F32);
  };
  for (size_t i = 0; i < maps.size(); ++i) {
    const Mapping& mp = maps[i];
    const GgufTensor& t = writer.tensors()[i];
    switch (mp.link) {
      case Link::Same: {
        const Tensor x = read_f32(mp.hyla[0]);
        HYLA_CHECK(x.numel() == t.numel(), "'{}' has {} values, '{}' needs {}", mp.hyla[0], x.numel(), t.name, t.numel());
        write_f32(t, x.data<float>(), x.numel());
        break;
      }
      case Link::NegExp: {
        const Tensor a = read_f32(mp.hyla[0]);
        std::vector<float> v(size_t(a.numel()));
        for (size_t h = 0; h < v.size(); ++h) v[h] = float(-std::exp(double(a.data<float>()[h])));
        write_f32(t, v.data(), int64_t(v.size()));
        break;
      }
      case Link::Experts:
        for (const std::string& name : mp.hyla) {
          if (GgmlType(t.type) == GgmlType::MXFP4) {
            HYLA_CHECK(weights.entry(name).dtype == DType::U8, "{}: tensor '{}' is {}, but the other experts of '{}' are MXFP4",
                       weights.file_of(name), name, dtype_name(weights.entry(name).dtype), t.name);
            const Tensor codes = weights.get(name), scales = weights.get(mxfp4_scale_name(name));
            const int64_t n = codes.numel() * 2;
            bytes.resize(ggml_bytes(GgmlType::MXFP4, n));
            mxfp4_codes_to_blocks(codes.data<uint8_t>(), scales.data<uint8_t>(), n, bytes.data());
            writer.write(bytes.data(), bytes.size());
            continue;
          }
          const Tensor x = read_f32(name);
          write_f32(t, x.data<float>(), x.numel());
        }
        break;
      case Link::KeyB:
      case Link::ValueB: {
        const int64_t H = m.num_heads, Dn = m.qk_nope_head_dim, Dv = m.v_head_dim, cl = m.kv_lora_rank;
        const Tensor kvb = read_f32(mp.hyla[0]);
        const float* x = kvb.data<float>();
        std::vector<float> v(size_t(t.numel()));
        for (int64_t h = 0; h < H; ++h) {
          if (mp.link == Link::KeyB) {
            for (int64_t j = 0; j < cl; ++j)
              for (int64_t n = 0; n < Dn; ++n) v[size_t((h * cl + j) * Dn + n)] = x[(h * (Dn + Dv) + n) * cl + j];
          } else {
            std::memcpy(v.data() + h * Dv * cl, x + (h * (Dn + Dv) + Dn) * cl, size_t(Dv * cl) * 4);
          }
        }
        write_f32(t, v.data(), int64_t(v.size()));
        break;
      }
      case Link::Score: {
        const Tensor q = read_f32(mp.hyla[0]), n = read_f32(mp.hyla[1]);
        std::vector<float> v(size_t(q.numel()));
        for (size_t j = 0; j < v.size(); ++j) v[j] = q.data<float>()[j] * n.data<float>()[j];
        write_f32(t, v.data(), int64_t(v.size()));
        break;
      }
    }
  }
  writer.commit();
  return {arch, writer.paths()};
}

}  // namespace hyla
