// MoonViT and llama.cpp's mmproj files (model/moonvit_gguf.h): a tower written as a kimik25 mmproj
// and read back beside a text GGUF gives the image the same embeddings; q and k rows sit where
// llama.cpp's converter puts them; what the format cannot hold, and files that do not hold it, are
// errors that name the problem.
#include <gtest/gtest.h>

#include <cmath>

#include "hyla/io/gguf.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/model.h"
#include "hyla/model/model_files.h"
#include "hyla/model/moonvit_gguf.h"
#include "model_test_util.h"
#include "test_util.h"

namespace hyla {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

// kimi-k3-tiny with a K2.5-variant tower (the one an mmproj holds): 2 blocks of 4 heads of 8.
ModelConfig k25_vision_config() {
  ModelConfig c = model_config_of((test::source_dir() / "configs/kimi-k3-tiny.json").string());
  c.vision.enabled = true, c.vision.tower = VisionTower::MoonVit, c.vision.patch_size = 2, c.vision.channels = 3;
  MoonVitConfig& m = c.vision.moonvit;
  m.hidden_size = 32, m.num_heads = 4, m.head_dim = 8, m.num_layers = 2, m.intermediate_size = 48;
  m.pos_emb_height = 3, m.pos_emb_width = 5;
  // An epsilon that f32 holds exactly: the file stores it as f32.
  m.norm = VisionNorm::LayerNorm, m.norm_eps = m.projector_eps = 1.0 / 131072, m.bias = true;
  m.pos_emb_resample = GridResample::Bicubic, m.projector = VisionProjector::PatchMerger;
  m.in_patch_limit = 4096;
  c.validate("k25_vision_config");
  return c;
}

ModelInput image_prompt(const ModelConfig& c) {
  ModelInput in;
  const int32_t pad = 500;
  in.ids = {5, 17, pad, pad, pad, pad, pad, pad, 33, 8};
  in.tokens = TokenBatch::packed({int64_t(in.ids.size())});
  in.image_pad_id = pad;
  Image img{8, 12, 3, {}};  // 4 × 6 patches of 2×2: 2 × 3 merged tokens
  for (int i = 0; i < 8 * 12 * 3; ++i) img.pixels.push_back(uint8_t((i * 53 + 7) % 256));
  in.images = {img};
  EXPECT_EQ(c.vision.moonvit.merge, 2);
  return in;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// A model directory with random weights, its text GGUF and its mmproj.
struct Files {
  TempDir dir;
  ModelConfig config = k25_vision_config();
  Files() {
    Model model(config);
    model.initialize(3);
    test::randomize_params(model.params(), 29);
    model.save(dir / "model", DType::F32);
    save_gguf(dir / "text.gguf", config, ModelWeights(dir / "model"), {});
    save_moonvit_mmproj(dir / "mmproj.gguf", config, ModelWeights(dir / "model"));
  }
};

TEST(MoonVitGguf, AnMmprojBesideATextGgufGivesTheSameImage) {
  Files f;
  const auto original = Model::load(f.dir / "model");
  const auto joined = Model::load(f.dir / "text.gguf", {.mmproj = f.dir / "mmproj.gguf"});
  // The tower's config comes back from the clip keys.
  EXPECT_EQ(joined->config().vision_json().dump(1), f.config.vision_json().dump(1));
  const ModelInput in = image_prompt(f.config);
  const ForwardOptions options{.precision = Precision::F32, .outputs = Outputs::All};
  const Tensor want = original->forward(in, options).logits;
  const Tensor want_image = original->image_embeddings();
  const Tensor got = joined->forward(in, options).logits;
  EXPECT_EQ(max_abs_difference(joined->image_embeddings(), want_image), 0);  // the same f32 values, moved back
  EXPECT_LT(max_abs_difference(got, want), 1e-5);  // the text GGUF's A_log goes through −exp and back
  const ModelFiles files = open_model_files(f.dir / "text.gguf", {.mmproj = f.dir / "mmproj.gguf"});
  EXPECT_TRUE(files.weights->contains("vision_tower.encoder.blocks.1.wqkv.weight"));
}

// llama.cpp's converter: per head, reshape(head_dim / 4, 2, 2) → permute(1, 0, 2): the column pair
// of each rotary quad first, then the row pairs. v's rows stay where they are.
TEST(MoonVitGguf, QAndKRowsSitWhereLlamaCppsConverterPutsThem) {
  ModelConfig c = k25_vision_config();
  Model model(c);
  model.initialize(3);
  const MoonVitConfig& m = c.vision.moonvit;
  const int64_t D = m.hidden_size, hd = m.head_dim, inner = m.num_heads * hd;
  Param& wqkv = model.params().get("vision_tower.encoder.blocks.0.wqkv.weight");
  Param& bias = model.params().get("vision_tower.encoder.blocks.0.wqkv.bias");
  for (int64_t r = 0; r < 3 * inner; ++r) {
    bias.v()[r] = float(r);
    for (int64_t col = 0; col < D; ++col) wqkv.v()[r * D + col] = float(r * 1000 + col);
  }
  TempDir dir;
  model.save(dir / "model", DType::F32);
  save_moonvit_mmproj(dir / "mm.gguf", c, ModelWeights(dir / "model"));
  const GgufFile g(dir / "mm.gguf");
  const Tensor w = g.to_f32(g.tensor("v.blk.0.attn_qkv.weight")), b = g.to_f32(g.tensor("v.blk.0.attn_qkv.bias"));
  for (int64_t part = 0; part < 3; ++part)
    for (int64_t h = 0; h < m.num_heads; ++h)
      for (int64_t i = 0; i < hd / 4; ++i)
        for (int64_t axis = 0; axis < 2; ++axis)
          for (int64_t e = 0; e < 2; ++e) {
            const int64_t base = part * inner + h * hd, interleaved = base + i * 4 + axis * 2 + e;
            const int64_t file = part == 2 ? interleaved : base + axis * hd / 2 + i * 2 + e;
            EXPECT_EQ(b.data<float>()[file], float(interleaved));
            EXPECT_EQ(w.data<float>()[file * D + 3], float(interleaved * 1000 + 3));
          }
  // The clip keys llama.cpp's kimik25 loader reads.
  EXPECT_EQ(g.string("clip.projector_type"), "kimik25");
  EXPECT_EQ(g.integer("clip.vision.projection_dim"), c.hidden_size);
  EXPECT_EQ(g.integer("clip.vision.projector.scale_factor"), 2);
  EXPECT_EQ(g.integer("vision.pos_emb_height"), 3);
  EXPECT_EQ(g.tensor("v.position_embd.weight").ne, (std::vector<int64_t>{D, 5, 3}));
  EXPECT_EQ(g.tensor("v.patch_embd.weight").ne, (std::vector<int64_t>{2, 2, 3, D}));
}

TEST(MoonVitGguf, WhatAnMmprojCannotHoldIsRefusedByName) {
  TempDir dir;
  const auto refused = [&](auto change, const std::string& message) {
    ModelConfig c = k25_vision_config();
    change(c.vision.moonvit);
    Model model(c);
    model.initialize(1);
    model.save(dir / "m", DType::F32);
    test::expect_error([&] { save_moonvit_mmproj(dir / "mm.gguf", c, ModelWeights(dir / "m")); }, message);
    EXPECT_FALSE(fs::exists(dir / "mm.gguf"));
  };
  refused([](MoonVitConfig& m) { m.norm = VisionNorm::RmsNorm, m.norm_eps = 1.0 / 128; }, "vision.moonvit.norm rmsnorm");
  refused([](MoonVitConfig& m) { m.bias = false; }, "vision.moonvit.bias false");
  refused([](MoonVitConfig& m) { m.projector = VisionProjector::PatchMergerV2; }, "projector patchmergerv2");
  refused([](MoonVitConfig& m) { m.projector_gelu = Gelu::Tanh; }, "projector_gelu tanh");
  refused([](MoonVitConfig& m) { m.head_dim = 12; }, "kimik25's attention is as wide as the tower");
  ModelConfig text = model_config_of((test::source_dir() / "configs/kimi-k3-tiny.json").string());
  Model model(text);
  model.initialize(1);
  model.save(dir / "text", DType::F32);
  test::expect_error([&] { save_moonvit_mmproj(dir / "mm.gguf", text, ModelWeights(dir / "text")); },
                     "the model has no MoonViT tower");
}

// Rewrites one metadata value or drops one tensor of an mmproj, by writing the file anew.
void rewrite(const fs::path& from, const fs::path& to, const std::string& key, const GgufValue* value,
             const std::string& drop_tensor = "", const std::string& extra_tensor = "") {
  const GgufFile g(from);
  GgufMetadata meta = g.metadata();
  if (!key.empty()) meta[key] = *value;
  std::vector<GgufTensor> tensors;
  for (const GgufTensor& t : g.tensors())
    if (t.name != drop_tensor) tensors.push_back({t.name, t.ne, t.type, 0, 0});
  if (!extra_tensor.empty()) tensors.push_back({extra_tensor, {4}, uint32_t(GgmlType::F32), 0, 0});
  GgufWriter w(to, meta, tensors);
  for (const GgufTensor& t : g.tensors())
    if (t.name != drop_tensor) w.write(g.data(t), t.bytes);
  if (!extra_tensor.empty()) {
    const float zeros[4] = {};
    w.write(zeros, sizeof(zeros));
  }
  w.commit();
}

TEST(MoonVitGguf, FilesThatAreNotAKimik25MmprojNameTheProblem) {
  Files f;
  const fs::path bad = f.dir / "bad.gguf";
  const auto load = [&](const fs::path& mmproj) { Model::load(f.dir / "text.gguf", {.mmproj = mmproj}); };
  const GgufValue other = GgufValue::string("qwen2vl_merger"), width = GgufValue::u32(48);
  rewrite(f.dir / "mmproj.gguf", bad, "clip.projector_type", &other);
  test::expect_error([&] { load(bad); }, "clip.projector_type \"qwen2vl_merger\": hyla reads the kimik25 projector");
  rewrite(f.dir / "mmproj.gguf", bad, "clip.vision.projection_dim", &width);
  test::expect_error([&] { load(bad); }, "clip.vision.projection_dim is 48, the text model's hidden_size 64");
  rewrite(f.dir / "mmproj.gguf", bad, "", nullptr, "mm.2.bias");
  test::expect_error([&] { load(bad); }, "missing tensor 'mm.2.bias'");
  rewrite(f.dir / "mmproj.gguf", bad, "", nullptr, "", "v.time_embd.weight");
  test::expect_error([&] { load(bad); }, "unknown tensor 'v.time_embd.weight'");
  test::expect_error([&] { load(f.dir / "text.gguf"); }, "not an mmproj file");
  test::expect_error([&] { load(f.dir / "model" / "config.json"); }, "not an mmproj: not a file that starts with the GGUF magic");
  test::expect_error([&] { load(f.dir / "none.gguf"); }, "none.gguf: no such file (--mmproj)");
  // A model that has a tower already takes none from a file.
  test::expect_error([&] { Model::load(f.dir / "model", {.mmproj = f.dir / "mmproj.gguf"}); },
                     "the model has a vision tower already");
}

}  // namespace
}  // namespace hyla
