#include <gtest/gtest.h>

#include <filesystem>
#include <limits>

#include "hyla/core/error.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/model/model_files.h"
#include "hyla/model/config.h"
#include "test_util.h"

namespace hyla {
namespace {

using json = nlohmann::json;

json small_json() { return parse_json_file((test::source_dir() / "configs/small.json").string()); }

void expect_error(const json& j, const std::string& what) {
  try {
    ModelConfig::from_json(j, "cfg.json");
    FAIL() << "no error; expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
}

TEST(Config, SmallMatchesSpecExample) {
  const ModelConfig c = ModelConfig::from_json(small_json());
  EXPECT_EQ(c.vocab_size, 8192);
  EXPECT_EQ(c.hidden_size, 512);
  EXPECT_EQ(c.layer_types[3], LayerType::Mla);
  EXPECT_EQ(c.kda.gate, KdaGate::LowerBound);
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.balancing, Balancing::Quantile);
  EXPECT_TRUE(c.attn_res.enabled);
  // The defaults are the SPEC §1 example: a config of just the model type is the same model.
  const ModelConfig d = ModelConfig::from_json(json{{"model_type", "hyla"}});
  EXPECT_EQ(d.to_json(), c.to_json());
  // to_json round-trips.
  EXPECT_EQ(ModelConfig::from_json(c.to_json()).to_json(), c.to_json());
}

TEST(Config, HfBookkeepingKeysAreIgnored) {
  json j = small_json();
  j["architectures"] = {"HylaForCausalLM"};
  j["torch_dtype"] = "bfloat16";
  j["transformers_version"] = "4.50";
  j["_name_or_path"] = "x";
  EXPECT_NO_THROW(ModelConfig::from_json(j));
}

TEST(Config, RealOptionsMustBeFinite) {
  // A file's inf or NaN (a GGUF's expert_weights_scale, an HF situ_linear_beta) is refused by name.
  const ModelConfig base = model_config_of((test::source_dir() / "configs/kimi-k3-tiny.json").string());
  for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    ModelConfig c = base;
    c.moe.routed_scaling_factor = bad;
    test::expect_error([&] { c.validate("m.gguf"); }, "m.gguf: moe.routed_scaling_factor (");
    c = base;
    c.moe.situ_linear_beta = bad;
    test::expect_error([&] { c.validate("m.gguf"); }, "moe.situ_linear_beta");
    c = base;
    c.rms_norm_eps = bad;
    test::expect_error([&] { c.validate("m.gguf"); }, "rms_norm_eps");
  }
}

// The Kimi K3 / Kimi Linear options (SPEC §3–§5): read, written back, and validated by name.
TEST(Config, KimiOptionsRoundTripAndAreValidated) {
  const ModelConfig k3 = model_config_of((test::source_dir() / "configs/kimi-k3.json").string());
  EXPECT_EQ(k3.kda.gate_rank, 128);
  EXPECT_EQ(k3.kda.output_gate_rank, 0);
  EXPECT_FALSE(k3.mla.rope);
  EXPECT_EQ(k3.moe.dense_activation, Activation::Situ);
  EXPECT_EQ(k3.moe.shared_activation, Activation::Situ);
  EXPECT_EQ(k3.moe.situ_beta, 4.0);
  EXPECT_EQ(k3.moe.situ_linear_beta, 25.0);
  EXPECT_TRUE(k3.moe.shared_full_width);
  EXPECT_EQ(ModelConfig::from_json(k3.to_json()).to_json(), k3.to_json());
  for (const char* tiny : {"configs/kimi-k3-tiny.json", "configs/kimi-linear-tiny.json"})
    EXPECT_NO_THROW(model_config_of((test::source_dir() / tiny).string())) << tiny;

  json j = small_json();
  j["kda"]["gate_rank"] = -1;
  expect_error(j, "kda.gate_rank (-1) must be >= 0");
  j = small_json();
  j["kda"]["output_gate_rank"] = -2;
  expect_error(j, "kda.output_gate_rank (-2) must be >= 0");
  j = small_json();
  j["moe"]["situ_beta"] = 0.0;
  expect_error(j, "moe.situ_beta (0) must be > 0");
  j = small_json();
  j["moe"]["dense_activation"] = "gelu";
  expect_error(j, "moe.dense_activation must be one of swiglu, situ");
  j = small_json();
  j["mla"]["rope"] = "no";
  expect_error(j, "mla.rope");
}

// Ling 3.0's options (SPEC §4, §5): read, written back, and validated by name.
TEST(Config, LingOptionsRoundTripAndAreValidated) {
  const ModelConfig ling = model_config_of((test::source_dir() / "configs/ling3-tiny.json").string());
  EXPECT_TRUE(ling.mla.output_gate_per_head);
  EXPECT_EQ(ling.moe.shared_width(), 48);
  EXPECT_EQ(ling.moe.swiglu_limit, 7.0);
  EXPECT_EQ(ModelConfig::from_json(ling.to_json()).to_json(), ling.to_json());
  EXPECT_EQ(model_config_of((test::source_dir() / "configs/small.json").string()).moe.shared_width(), 128);

  json j = small_json();
  j["moe"]["swiglu_limit"] = -1.0;
  expect_error(j, "moe.swiglu_limit and shared_swiglu_limit must be >= 0");
  j = small_json();
  j["moe"]["activation"] = "situ";
  j["moe"]["swiglu_limit"] = 7.0;
  expect_error(j, "moe.swiglu_limit clamps SwiGLU; moe.activation is not swiglu");
  j = small_json();
  j["moe"]["shared_intermediate_size"] = -3;
  expect_error(j, "moe.shared_intermediate_size (-3) must be >= 0");
  j = small_json();
  j["mla"]["output_gate"] = false;
  j["mla"]["output_gate_per_head"] = true;
  expect_error(j, "mla.output_gate_per_head needs mla.output_gate");
}

// A released config.json (Kimi K3's, its text model under text_config) reads as configs/kimi-k3.json.
TEST(Config, HfKimiK3ConfigIsTheReleasedShape) {
  const ModelConfig hf = model_config_of((test::source_dir() / "tests/data/kimi-k3-hf-config.json").string());
  const ModelConfig ours = model_config_of((test::source_dir() / "configs/kimi-k3.json").string());
  EXPECT_EQ(hf.to_json(), ours.to_json());
  EXPECT_EQ(hf.mla.norm_eps, 1e-6);  // the official code's latent norms, not rms_norm_eps (SPEC §4)
  // Its vision_config: MoonViT with K3's variant (SPEC §7.2), heads of 1536 / 12.
  EXPECT_EQ(hf.vision.tower, VisionTower::MoonVit);
  EXPECT_EQ(hf.vision.moonvit.head_dim, 128);
  EXPECT_EQ(hf.vision.moonvit.norm_eps, 0.0078125);
  EXPECT_EQ(hf.vision.moonvit.projector, VisionProjector::PatchMergerV2);
  EXPECT_EQ(hf.rms_norm_eps, 1e-5);
}

// mla.norm_eps: rms_norm_eps where a hyla config does not name it; a HF config's own key wins.
TEST(Config, LatentNormEpsDefaultsByFormat) {
  json j = small_json();
  j["rms_norm_eps"] = 3e-6;
  EXPECT_EQ(ModelConfig::from_json(j).mla.norm_eps, 3e-6);
  j["mla"]["norm_eps"] = 2e-6;
  EXPECT_EQ(ModelConfig::from_json(j).mla.norm_eps, 2e-6);
  j["mla"]["norm_eps"] = 0.0;
  expect_error(j, "mla.norm_eps (0) must lie in (0, 1)");
  json hf = parse_json_file((test::source_dir() / "tests/data/kimi-linear-48b-a3b-hf-config.json").string());
  hf["mla_norm_eps"] = 4e-6;
  const std::string path = (std::filesystem::temp_directory_path() / "hyla-hf-norm-eps.json").string();
  write_file_atomic(path, hf.dump());
  EXPECT_EQ(model_config_of(path).mla.norm_eps, 4e-6);
  std::filesystem::remove(path);
}

TEST(Config, HfKimiLinearConfigHasBothGatesLowRankAndNoAttnRes) {
  const ModelConfig c =
      model_config_of((test::source_dir() / "tests/data/kimi-linear-48b-a3b-hf-config.json").string());
  EXPECT_EQ(c.layer_types[3], LayerType::Mla);
  EXPECT_EQ(c.layer_types[26], LayerType::Mla);
  EXPECT_EQ(c.layer_types[25], LayerType::Kda);
  EXPECT_EQ(c.kda.gate, KdaGate::Softplus);
  EXPECT_EQ(c.kda.gate_rank, 128);
  EXPECT_EQ(c.kda.output_gate_rank, 128);
  EXPECT_FALSE(c.mla.rope);
  EXPECT_FALSE(c.mla.output_gate);
  EXPECT_EQ(c.mla.q_lora_rank, 0);  // null in the file
  EXPECT_EQ(c.moe.activation, Activation::Swiglu);
  EXPECT_FALSE(c.attn_res.enabled);
}

// Writes `file` with `contents`, then loading `config` must fail naming `what` and `file`.
void expect_load_error(const std::filesystem::path& config, const std::filesystem::path& file, const json& contents,
                       const std::string& what) {
  write_file_atomic(file, contents.dump());
  try {
    model_config_of(config.string());
    FAIL() << "no error; expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
}

// A checkpoint's preprocessor_config.json beside config.json sets MoonViT's processor; what
// contradicts vision_config is an error naming the file and the key.
TEST(Config, HfPreprocessorConfigSetsTheProcessor) {
  test::TempDir dir;
  std::filesystem::copy_file(test::source_dir() / "tests/data/kimi-k3-hf-config.json", dir / "config.json");
  EXPECT_EQ(model_config_of((dir / "config.json").string()).vision.moonvit.in_patch_limit, 16384);  // none: defaults
  json processor = {{"media_proc_cfg", {{"in_patch_limit", 65536}, {"patch_limit_on_one_side", 1024},
                                        {"image_mean", {0.48, 0.46, 0.41}}, {"image_std", {0.27, 0.26, 0.28}},
                                        {"patch_size", 14}, {"merge_kernel_size", 2}, {"sample_fps", 2.0}}}};
  write_file_atomic(dir / "preprocessor_config.json", processor.dump());
  const MoonVitConfig m = model_config_of((dir / "config.json").string()).vision.moonvit;
  EXPECT_EQ(m.in_patch_limit, 65536);
  EXPECT_EQ(m.patch_limit_on_one_side, 1024);
  EXPECT_EQ(m.image_mean, (std::vector<double>{0.48, 0.46, 0.41}));
  EXPECT_EQ(m.image_std, (std::vector<double>{0.27, 0.26, 0.28}));
  const auto expect_error = [&](const json& bad, const std::string& what) {
    expect_load_error(dir / "config.json", dir / "preprocessor_config.json", bad, what);
  };
  json bad = processor;
  bad["media_proc_cfg"]["merge_kernel_size"] = 4;
  expect_error(bad, "media_proc_cfg.merge_kernel_size is not vision_config's merge [2, 2]");
  bad = processor;
  bad["media_proc_cfg"]["patch_size"] = 16;
  expect_error(bad, "media_proc_cfg.patch_size is 16, vision_config's patch_size 14");
  bad = processor;
  bad["media_proc_cfg"]["image_std"] = {0.5, 0.0, 0.5};
  expect_error(bad, "image_std (0) must be > 0");
  bad = processor;
  bad["media_proc_cfg"]["in_patch_limit"] = "many";
  expect_error(bad, "in_patch_limit");
}

TEST(Config, HfConfigErrorsNameTheFileAndKey) {
  json j = parse_json_file((test::source_dir() / "tests/data/kimi-k3-hf-config.json").string());
  auto expect_hf_error = [](const json& config, const std::string& what) {
    const std::filesystem::path path = std::filesystem::temp_directory_path() / "hyla-hf-config-test.json";
    expect_load_error(path, path, config, what);
  };
  json bad = j;
  bad["model_type"] = "llama";
  expect_hf_error(bad, "model_type \"llama\" is not an architecture hyla reads");
  bad = j;
  bad["vision_config"]["mlp_type"] = "swiglu";
  expect_hf_error(bad, "vision_config.mlp_type is \"swiglu\"");
  bad = j;
  bad["vision_config"]["qkv_hidden_size"] = 1000;
  expect_hf_error(bad, "vision_config.qkv_hidden_size is not a whole number of heads");
  bad = j;
  bad["vision_config"]["text_hidden_size"] = 4096;
  expect_hf_error(bad, "vision_config.text_hidden_size must equal the text model's hidden_size");
  bad = j;
  bad["text_config"]["num_expert_group"] = 8;
  expect_hf_error(bad, "text_config.num_expert_group > 1");
  bad = j;
  bad["text_config"]["linear_attn_config"]["full_attn_layers"].push_back(94);
  expect_hf_error(bad, "text_config.linear_attn_config.full_attn_layers holds 94");
  bad = j;
  bad["text_config"].erase("kv_lora_rank");
  expect_hf_error(bad, "text_config.kv_lora_rank is required");
  bad = j;
  bad["text_config"]["hidden_act"] = "gelu";
  expect_hf_error(bad, "text_config.hidden_act is \"gelu\"");
}

TEST(Config, ErrorsNameTheKeyAndRule) {
  json j = small_json();
  j["hidden_sise"] = 5;
  expect_error(j, "unknown key hidden_sise");
  j = small_json();
  j["moe"]["top_k"] = 5;
  expect_error(j, "unknown key moe.top_k");
  j = small_json();
  j["moe"]["num_experts"] = 8;
  j["moe"]["num_experts_per_tok"] = 9;
  expect_error(j, "moe.num_experts_per_tok (9) > moe.num_experts (8)");
  j["moe"]["num_experts_per_tok"] = 8;
  expect_error(j, "must be < moe.num_experts (8) for quantile balancing");
  j["moe"]["balancing"] = "none";
  EXPECT_NO_THROW(ModelConfig::from_json(j));
  j = small_json();
  j["kda"]["gate_lower_bound"] = -6.0;
  expect_error(j, "kda.gate_lower_bound (-6) must lie in [-5, 0)");
  j["kda"]["gate"] = "softplus";
  EXPECT_NO_THROW(ModelConfig::from_json(j));
  j = small_json();
  j["kda"]["gate"] = "sigmoid";
  expect_error(j, "kda.gate must be one of lower_bound, softplus");
  j = small_json();
  j["hidden_size"] = "512";
  expect_error(j, "hidden_size must be an integer");
  j = small_json();
  j["hidden_size"] = 512.5;
  expect_error(j, "hidden_size must be an integer");
  j = small_json();
  j["num_hidden_layers"] = 4;
  expect_error(j, "layer_types has 8 entries but num_hidden_layers is 4");
  j = small_json();
  j["layer_types"][1] = "swa";
  expect_error(j, "layer_types[1] is \"swa\" but mla.sliding_window is 0");
  j["layer_types"][1] = "attention";
  expect_error(j, "layer_types must be one of kda, mla, swa");
  j = small_json();
  j["mla"]["qk_rope_head_dim"] = 3;
  expect_error(j, "must be even");
  j = small_json();
  j["model_type"] = "llama";
  expect_error(j, "model_type must be \"hyla\"");
  j.erase("model_type");
  expect_error(j, "model_type is required");
  j = small_json();
  j["kda"]["chunk_size"] = 40;
  expect_error(j, "kda.chunk_size (40)");
  j = small_json();
  j["moe"] = 3;
  expect_error(j, "moe must be an object");
}

TEST(Config, LoadNamesTheFile) {
  test::TempDir dir;
  test::write_bytes(dir / "config.json", "{\"model_type\": \"hyla\",");
  try {
    model_config_of((dir / "config.json").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model_config_of((dir / "missing.json").string()), Error);
}

}  // namespace
}  // namespace hyla
