#include "hyla/model/moonvit_gguf.h"

#include <fmt/format.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "hyla/core/error.h"

namespace hyla {
namespace {

namespace fs = std::filesystem;

enum class Layout : uint8_t {
  Same,  // the same values in the same order (hyla's shape is ggml's, reversed, or flattened to it)
  Qkv,   // wqkv (weight or bias): q and k rows in split rotary order in the file
};

struct Mapping {
  std::string gguf, hyla;
  std::vector<int64_t> ne;  // ggml's dimensions, fastest first
  Layout layout = Layout::Same;
};

std::vector<Mapping> mappings(const VisionConfig& vision, int64_t text_hidden) {
  const MoonVitConfig& m = vision.moonvit;
  const int64_t D = m.hidden_size, P = vision.patch_size, I = m.intermediate_size, merged = m.merge * m.merge * D;
  std::vector<Mapping> maps = {
      {"v.patch_embd.weight", "vision_tower.patch_embed.proj.weight", {P, P, vision.channels, D}},
      {"v.patch_embd.bias", "vision_tower.patch_embed.proj.bias", {D}},
      {"v.position_embd.weight", "vision_tower.patch_embed.pos_emb.weight", {D, m.pos_emb_width, m.pos_emb_height}},
  };
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string g = fmt::format("v.blk.{}.", l), h = fmt::format("vision_tower.encoder.blocks.{}.", l);
    for (const auto& [gguf, hyla] : {std::pair{"ln1", "norm0"}, {"ln2", "norm1"}})
      for (const char* part : {"weight", "bias"})
        maps.push_back({g + gguf + "." + part, h + hyla + "." + part, {D}});
    maps.push_back({g + "attn_qkv.weight", h + "wqkv.weight", {D, 3 * D}, Layout::Qkv});
    maps.push_back({g + "attn_qkv.bias", h + "wqkv.bias", {3 * D}, Layout::Qkv});
    maps.push_back({g + "attn_out.weight", h + "wo.weight", {D, D}});
    maps.push_back({g + "attn_out.bias", h + "wo.bias", {D}});
    maps.push_back({g + "ffn_up.weight", h + "mlp.fc0.weight", {D, I}});
    maps.push_back({g + "ffn_up.bias", h + "mlp.fc0.bias", {I}});
    maps.push_back({g + "ffn_down.weight", h + "mlp.fc1.weight", {I, D}});
    maps.push_back({g + "ffn_down.bias", h + "mlp.fc1.bias", {D}});
  }
  for (const char* part : {"weight", "bias"}) {
    maps.push_back({fmt::format("v.post_ln.{}", part), fmt::format("vision_tower.encoder.final_layernorm.{}", part), {D}});
    maps.push_back({fmt::format("mm.input_norm.{}", part), fmt::format("mm_projector.pre_norm.{}", part), {D}});
  }
  maps.push_back({"mm.1.weight", "mm_projector.proj.0.weight", {merged, merged}});
  maps.push_back({"mm.1.bias", "mm_projector.proj.0.bias", {merged}});
  maps.push_back({"mm.2.weight", "mm_projector.proj.2.weight", {merged, text_hidden}});
  maps.push_back({"mm.2.bias", "mm_projector.proj.2.bias", {text_hidden}});
  return maps;
}

// Moves wqkv's q and k rows (each `cols` values) between hyla's interleaved rotary order (per head:
// quads of column pair, row pair) and the file's split order (per head: every column pair, then
// every row pair), as llama.cpp's converter does; v's rows stay.
void move_qkv_rows(const float* from, float* to, int64_t heads, int64_t head_dim, int64_t cols, bool to_file) {
  const int64_t inner = heads * head_dim, quads = head_dim / 4;
  std::memcpy(to + 2 * inner * cols, from + 2 * inner * cols, size_t(inner * cols) * sizeof(float));
  for (int64_t part = 0; part < 2; ++part)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < quads; ++i)
        for (int64_t axis = 0; axis < 2; ++axis)
          for (int64_t e = 0; e < 2; ++e) {
            const int64_t base = part * inner + h * head_dim;
            const int64_t interleaved = base + i * 4 + axis * 2 + e, split = base + axis * (head_dim / 2) + i * 2 + e;
            const int64_t src = to_file ? interleaved : split, dst = to_file ? split : interleaved;
            std::memcpy(to + dst * cols, from + src * cols, size_t(cols) * sizeof(float));
          }
}

std::vector<double> numbers(const GgufFile& g, const std::string& key) {
  const GgufValue& v = g.metadata().at(key);
  HYLA_CHECK(v.type == GgufValueType::Array && (v.array.element() == GgufValueType::F32 || v.array.is_integer()),
             "{}: {} is not an array of numbers", g.path().string(), key);
  std::vector<double> out;
  for (uint64_t i = 0; i < v.array.size(); ++i) out.push_back(v.array.at(i).get<double>());
  return out;
}

}  // namespace

bool is_mmproj(const GgufFile& gguf) {
  return gguf.has("general.architecture") && gguf.string("general.architecture") == "clip";
}

VisionConfig vision_config_from_mmproj(const GgufFile& g, int64_t text_hidden) {
  const std::string source = g.path().string();
  HYLA_CHECK(is_mmproj(g), "{}: not an mmproj file (general.architecture is not \"clip\")", source);
  const std::string projector = g.has("clip.projector_type") ? g.string("clip.projector_type") : "";
  HYLA_CHECK(projector == "kimik25",
             "{}: clip.projector_type \"{}\": hyla reads the kimik25 projector (Kimi's MoonViT) only", source, projector);
  HYLA_CHECK(g.has("clip.has_vision_encoder") && g.boolean("clip.has_vision_encoder"),
             "{}: clip.has_vision_encoder is not true", source);
  HYLA_CHECK(g.has("clip.use_gelu") && g.boolean("clip.use_gelu"),
             "{}: clip.use_gelu is not true: a kimik25 tower's MLP is GELU", source);
  const int64_t projection = g.integer("clip.vision.projection_dim");
  HYLA_CHECK(projection == text_hidden, "{}: clip.vision.projection_dim is {}, the text model's hidden_size {}", source,
             projection, text_hidden);
  VisionConfig v;
  v.enabled = true, v.tower = VisionTower::MoonVit, v.channels = 3;
  v.patch_size = g.integer("clip.vision.patch_size");
  MoonVitConfig& m = v.moonvit;
  m.hidden_size = g.integer("clip.vision.embedding_length");
  m.num_heads = g.integer("clip.vision.attention.head_count");
  HYLA_CHECK(m.num_heads > 0 && m.hidden_size % m.num_heads == 0,
             "{}: clip.vision.embedding_length {} is not a whole number of heads ({})", source, m.hidden_size, m.num_heads);
  m.head_dim = m.hidden_size / m.num_heads;
  m.num_layers = g.integer("clip.vision.block_count");
  m.intermediate_size = g.integer("clip.vision.feed_forward_length");
  m.pos_emb_height = g.integer("vision.pos_emb_height");
  m.pos_emb_width = g.integer("vision.pos_emb_width");
  m.pos_emb_resample = GridResample::Bicubic;
  m.norm = VisionNorm::LayerNorm;
  m.norm_eps = m.projector_eps = g.number("clip.vision.attention.layer_norm_epsilon");
  m.bias = true;
  m.merge = g.integer("clip.vision.projector.scale_factor");
  m.projector = VisionProjector::PatchMerger;
  m.projector_gelu = Gelu::Erf;
  if (g.has("clip.vision.image_max_pixels"))
    m.in_patch_limit = g.integer("clip.vision.image_max_pixels") / std::max<int64_t>(v.patch_size * v.patch_size, 1);
  m.image_mean = numbers(g, "clip.vision.image_mean");
  m.image_std = numbers(g, "clip.vision.image_std");
  return v;
}

void add_mmproj_weights(std::shared_ptr<const GgufFile> gguf, const VisionConfig& vision, ModelWeights& weights) {
  const GgufFile& g = *gguf;
  const std::string source = g.path().string();
  for (const auto& file : g.mapped_files()) weights.keep_mapped(file);
  const int64_t text_hidden = g.integer("clip.vision.projection_dim");
  const MoonVitConfig& m = vision.moonvit;
  std::set<std::string> used;
  for (const Mapping& mp : mappings(vision, text_hidden)) {
    const GgufTensor* t = g.find(mp.gguf);
    HYLA_CHECK(t, "{}: missing tensor '{}' (for '{}')", source, mp.gguf, mp.hyla);
    HYLA_CHECK(t->ne == mp.ne, "{}: tensor '{}' has dimensions [{}], the config needs [{}]", source, mp.gguf,
               fmt::join(t->ne, ", "), fmt::join(mp.ne, ", "));
    used.insert(mp.gguf);
    Shape shape = t->shape();
    if (mp.gguf == "v.patch_embd.weight") shape = Shape{mp.ne[3], mp.ne[0] * mp.ne[1] * mp.ne[2]};
    const SafetensorsEntry entry{mp.hyla, DType::F32, shape, 0, t->bytes};
    if (mp.layout == Layout::Same) {
      weights.add(entry, source, [gguf, t, shape] { return gguf->to_f32(*t).reshape(shape); });
      continue;
    }
    const int64_t cols = t->ne.size() == 2 ? t->ne[0] : 1;
    weights.add(entry, source, [gguf, t, shape, cols, heads = m.num_heads, head_dim = m.head_dim] {
      const Tensor stored = gguf->to_f32(*t);
      Tensor out = Tensor::empty(DType::F32, shape);
      move_qkv_rows(stored.data<float>(), out.data<float>(), heads, head_dim, cols, /*to_file=*/false);
      return out;
    });
  }
  for (const GgufTensor& t : g.tensors())
    HYLA_CHECK(used.count(t.name), "{}: unknown tensor '{}' in a kimik25 mmproj", source, t.name);
}

void save_moonvit_mmproj(const fs::path& path, const ModelConfig& config, const ModelWeights& weights) {
  const VisionConfig& v = config.vision;
  const MoonVitConfig& m = v.moonvit;
  HYLA_CHECK(v.enabled && v.tower == VisionTower::MoonVit, "{}: the model has no MoonViT tower to write as an mmproj",
             path.string());
  // The kimik25 projector of llama.cpp's graph: what the file cannot say is refused by name.
  const auto refuse = [&](bool bad, const std::string& what) {
    HYLA_CHECK(!bad, "{}: an mmproj (llama.cpp's kimik25 graph) cannot hold vision.moonvit.{}", path.string(), what);
  };
  refuse(m.norm != VisionNorm::LayerNorm, "norm rmsnorm (K3's tower; kimik25 is K2.5's, with LayerNorm)");
  refuse(!m.bias, "bias false (kimik25 has biases)");
  refuse(m.pos_emb_resample != GridResample::Bicubic, "pos_emb_resample bilinear (kimik25 resizes bicubic)");
  refuse(m.projector != VisionProjector::PatchMerger, "projector patchmergerv2 (kimik25 is patchmerger)");
  refuse(m.num_heads * m.head_dim != m.hidden_size, "head_dim: kimik25's attention is as wide as the tower");
  refuse(m.projector_gelu != Gelu::Erf, "projector_gelu tanh (an mmproj's projector is the official GELU, erf)");
  refuse(m.norm_eps != m.projector_eps, "norm_eps != projector_eps (kimik25 has one epsilon)");
  refuse(m.rope_theta != 10000.0, "rope_theta other than 10000 (kimik25 fixes it)");
  refuse(m.patch_limit_on_one_side != MoonVitConfig{}.patch_limit_on_one_side,
         "patch_limit_on_one_side (the file has no key for it)");
  const int64_t P = v.patch_size;
  GgufMetadata meta;
  auto u32 = [&](const std::string& k, int64_t x) { meta[k] = GgufValue::u32(uint32_t(x)); };
  meta["general.architecture"] = GgufValue::string("clip");
  meta["general.type"] = GgufValue::string("mmproj");
  meta["general.name"] = GgufValue::string("hyla");
  meta["general.file_type"] = GgufValue::u32(0);
  meta["clip.has_vision_encoder"] = GgufValue::boolean(true);
  meta["clip.projector_type"] = GgufValue::string("kimik25");
  meta["clip.use_gelu"] = GgufValue::boolean(true);
  u32("clip.vision.projection_dim", config.hidden_size);
  u32("clip.vision.image_size", m.pos_emb_height * P);
  u32("clip.vision.patch_size", P);
  u32("clip.vision.embedding_length", m.hidden_size);
  u32("clip.vision.feed_forward_length", m.intermediate_size);
  u32("clip.vision.block_count", m.num_layers);
  u32("clip.vision.attention.head_count", m.num_heads);
  meta["clip.vision.attention.layer_norm_epsilon"] = GgufValue::f32(float(m.norm_eps));
  u32("clip.vision.projector.scale_factor", m.merge);
  u32("vision.pos_emb_height", m.pos_emb_height);
  u32("vision.pos_emb_width", m.pos_emb_width);
  u32("vision.pos_emb_time", 4);
  // llama.cpp's converter's floor of 8 patches; the official processor's limit as the ceiling.
  u32("clip.vision.image_min_pixels", 8 * P * P);
  u32("clip.vision.image_max_pixels", m.in_patch_limit * P * P);
  meta["clip.vision.image_mean"] = GgufValue::of_array(GgufValueType::F32, m.image_mean);
  meta["clip.vision.image_std"] = GgufValue::of_array(GgufValueType::F32, m.image_std);

  const std::vector<Mapping> maps = mappings(v, config.hidden_size);
  std::vector<GgufTensor> tensors;
  for (const Mapping& mp : maps) tensors.push_back({mp.gguf, mp.ne, uint32_t(GgmlType::F32), 0, 0});
  GgufWriter writer(path, meta, tensors);
  std::vector<float> moved;
  for (const Mapping& mp : maps) {
    const Tensor stored = weights.get(mp.hyla);
    const Tensor x = stored.dtype() == DType::F32 ? stored : stored.to(DType::F32);
    int64_t n = 1;
    for (int64_t e : mp.ne) n *= e;
    HYLA_CHECK(x.numel() == n, "'{}' has {} values, '{}' needs {}", mp.hyla, x.numel(), mp.gguf, n);
    const float* data = x.data<float>();
    if (mp.layout == Layout::Qkv) {
      moved.resize(size_t(n));
      move_qkv_rows(data, moved.data(), m.num_heads, m.head_dim, mp.ne.size() == 2 ? mp.ne[0] : 1, /*to_file=*/true);
      data = moved.data();
    }
    writer.write(data, size_t(n) * sizeof(float));
  }
  writer.commit();
}

}  // namespace hyla
