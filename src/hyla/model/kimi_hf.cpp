#include "hyla/model/kimi_hf.h"

#include <charconv>
#include <map>
#include <optional>

#include "hyla/core/error.h"

namespace hyla {
namespace {

struct Target {
  std::string name;
  std::optional<Shape> shape;  // a reshape of the same values
  bool a_log = false;          // the first H values
};

bool strip(std::string& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.erase(0, prefix.size());
  return true;
}

bool replace_suffix(std::string& s, std::string_view from, std::string_view to) {
  if (!s.ends_with(from)) return false;
  s.replace(s.size() - from.size(), from.size(), to);
  return true;
}

// hyla's name (and reshape) for a checkpoint tensor, nullopt for one hyla skips.
std::optional<Target> target_of(std::string name, const ModelConfig& c, const std::string& source) {
  strip(name, "language_model.");
  if (name.starts_with("vision_tower.") || name.starts_with("mm_projector.")) {
    if (!c.vision.enabled || c.vision.tower != VisionTower::MoonVit) return std::nullopt;
    // MoonViT keeps the checkpoint's names (SPEC §7.2); its patch convolution is held as a matrix.
    if (name == "vision_tower.patch_embed.proj.weight") {
      const int64_t P = c.vision.patch_size;
      return Target{name, Shape{c.vision.moonvit.hidden_size, c.vision.channels * P * P}};
    }
    return Target{name};
  }
  const int64_t d = c.hidden_size;
  if (name.ends_with("output_attn_res_proj.weight")) return Target{"model.out_res_query", Shape{d}};
  if (name.ends_with("output_attn_res_norm.weight")) return Target{"model.out_res_norm.weight"};
  std::string rest = name;
  if (!strip(rest, "model.layers.")) return Target{name};
  int64_t layer = -1;
  const auto dot = rest.find('.');
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + dot, layer);
  HYLA_CHECK(error == std::errc() && end == rest.data() + dot && layer >= 0 && layer < c.num_hidden_layers,
             "{}: tensor '{}' names layer '{}', outside the config's {} layers", source, name, rest.substr(0, dot),
             c.num_hidden_layers);
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  std::string t = rest.substr(dot + 1);
  if (t == "self_attention_res_proj.weight") return Target{p + "attn_res_query", Shape{d}};
  if (t == "self_attention_res_norm.weight") return Target{p + "attn_res_norm.weight"};
  if (t == "mlp_res_proj.weight") return Target{p + "mlp_res_query", Shape{d}};
  if (t == "mlp_res_norm.weight") return Target{p + "mlp_res_norm.weight"};
  if (t == "self_attn.A_log") return Target{p + t, Shape{c.kda.num_heads}, true};
  if (t == "self_attn.q_conv1d.weight" || t == "self_attn.k_conv1d.weight" || t == "self_attn.v_conv1d.weight")
    return Target{p + t, Shape{c.kda.num_heads * c.kda.head_dim, 1, c.kda.conv_kernel}};
  if (strip(t, "block_sparse_moe.")) {
    if (t == "gate.e_score_correction_bias" || t == "gate.weight" ||
        t.starts_with("shared_experts."))
      return Target{p + "mlp." + t};
    if (t == "routed_expert_down_proj.weight") return Target{p + "mlp.lat_down.weight"};
    if (t == "routed_expert_up_proj.weight") return Target{p + "mlp.lat_up.weight"};
    if (t == "routed_expert_norm.weight") return Target{p + "mlp.lat_norm.weight"};
    if (t.starts_with("experts.")) {
      // compressed-tensors MXFP4 ("mxfp4-pack-quantized") experts are hyla's MXFP4 format as they
      // are: weight_packed the codes, weight_scale the E8M0 scales (mxfp4_weights.h).
      for (auto [from, to] : {std::pair{".w1.weight", ".gate_proj.weight"}, std::pair{".w2.weight", ".down_proj.weight"},
                              std::pair{".w3.weight", ".up_proj.weight"}, std::pair{".w1.weight_packed", ".gate_proj.weight"},
                              std::pair{".w2.weight_packed", ".down_proj.weight"}, std::pair{".w3.weight_packed", ".up_proj.weight"},
                              std::pair{".w1.weight_scale", ".gate_proj.weight.scale"},
                              std::pair{".w2.weight_scale", ".down_proj.weight.scale"},
                              std::pair{".w3.weight_scale", ".up_proj.weight.scale"}})
        if (replace_suffix(t, from, to)) return Target{p + "mlp." + t};
    }
    fail("{}: tensor '{}' is not part of a Kimi MoE block hyla reads", source, name);
  }
  return Target{p + t};
}

}  // namespace

ModelWeights weights_from_hf(std::shared_ptr<const ModelWeights> checkpoint, const ModelConfig& config) {
  ModelWeights out;
  std::map<std::string, std::string> source_of;  // hyla's name → the checkpoint's
  for (const std::string& name : checkpoint->names()) {
    const std::optional<Target> t = target_of(name, config, checkpoint->file_of(name));
    if (!t) continue;
    SafetensorsEntry e = checkpoint->entry(name);
    const std::string file = checkpoint->file_of(name);
    const auto [given, fresh] = source_of.emplace(t->name, name);
    HYLA_CHECK(fresh, "{}: tensors '{}' and '{}' are both hyla's '{}'", file, given->second, name, t->name);
    if (t->a_log) {
      const int64_t H = t->shape->numel();
      HYLA_CHECK(e.shape.numel() >= H, "{}: tensor '{}' has {} values, fewer than the {} heads", file, name,
                 e.shape.numel(), H);
      e.name = t->name;
      e.shape = *t->shape;
      out.add(e, file, [checkpoint, name, H] {
        const Tensor a = checkpoint->get(name);
        return a.reshape(Shape{a.numel()}).rows(0, H);
      });
      continue;
    }
    if (t->shape) {
      HYLA_CHECK(t->shape->numel() == e.shape.numel(), "{}: tensor '{}' has shape {}, the config needs {} values ({})",
                 file, name, e.shape.str(), t->shape->numel(), t->name);
      e.shape = *t->shape;
    }
    e.name = t->name;
    out.add(e, file, [checkpoint, name, shape = e.shape] { return checkpoint->get(name).reshape(shape); });
  }
  return out;
}

}  // namespace hyla
