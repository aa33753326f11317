// The architecture seam (model/arch/architecture.h): the registry, the name a config carries and
// the rules it brings, the formats that carry it, and the computation that ignores it.
#include <gtest/gtest.h>

#include <set>

#include "hyla/io/file.h"
#include "hyla/model/arch/architecture.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/model.h"
#include "hyla/model/model_files.h"
#include "model_test_util.h"
#include "test_util.h"

namespace hyla {
namespace {

using json = nlohmann::json;
using test::TempDir;

json config_json(const char* file) { return parse_json_file((test::source_dir() / file).string()); }

TEST(ModelArchitecture, TheRegistryNamesEachArchitectureAndFormatOnce) {
  std::set<std::string_view> names, hf, gguf;
  for (const Architecture* a : architectures()) {
    EXPECT_TRUE(names.insert(a->name).second) << a->name;
    EXPECT_EQ(&architecture(a->name), a);
    EXPECT_FALSE(a->summary.empty()) << a->name;
    EXPECT_NE(a->check, nullptr) << a->name;
    if (!a->hf_model_type.empty()) {
      EXPECT_TRUE(hf.insert(a->hf_model_type).second) << a->name;
      EXPECT_EQ(architecture_of_hf(a->hf_model_type), a);
      EXPECT_TRUE(a->config_from_hf && a->hf_tensor) << a->name;
    }
    if (!a->gguf_arch.empty()) {
      EXPECT_TRUE(gguf.insert(a->gguf_arch).second) << a->name;
      EXPECT_EQ(architecture_of_gguf(a->gguf_arch), a);
      EXPECT_TRUE(a->read_gguf && a->write_gguf && a->gguf_tensors) << a->name;
    }
  }
  EXPECT_EQ(architectures().front()->name, "hyla");
  EXPECT_EQ(architecture_of_hf("llama"), nullptr);
  EXPECT_EQ(architecture_of_gguf("llama"), nullptr);
  test::expect_error([] { architecture("kimi-k3"); }, "architecture \"kimi-k3\" is not one hyla implements (hyla, kimi_k3");
}

TEST(ModelArchitecture, AConfigNamesItsArchitectureAndKeepsItsRules) {
  TempDir dir;
  const auto config_of = [&](const json& j) {
    test::write_bytes(dir / "config.json", j.dump(1));
    return model_config_of(dir / "config.json");
  };
  json j = config_json("configs/nano.json");
  EXPECT_EQ(config_of(j).architecture, "hyla");  // absent: hyla's own
  j["architecture"] = "qwen2";
  test::expect_error([&] { config_of(j); }, "config.json: architecture \"qwen2\" is not one hyla implements");
  j["architecture"] = 3;
  test::expect_error([&] { config_of(j); }, "architecture");

  // Each name brings its rules; a rule broken is named, with the file.
  j = config_json("configs/kimi-k3-tiny.json");
  EXPECT_EQ(config_of(j).architecture, "kimi_k3");
  j["moe"]["activation"] = "swiglu";
  test::expect_error([&] { config_of(j); }, "config.json: not a kimi_k3 model: kimi-k3 uses SiTU in every FFN");
  j = config_json("configs/kimi-linear-tiny.json");
  EXPECT_EQ(config_of(j).architecture, "kimi_linear");
  j["attn_res"]["enabled"] = true;
  test::expect_error([&] { config_of(j); }, "not a kimi_linear model: kimi-linear has no attention residuals");
  j = config_json("configs/kimi-linear-tiny.json");
  j["layer_types"][0] = "swa";
  j["mla"]["sliding_window"] = 4;
  test::expect_error([&] { config_of(j); }, "not a kimi_linear model: llama.cpp has no sliding-window");
  // The same options under hyla's own name are SPEC's, with no rule beyond it.
  j["architecture"] = "hyla";
  j["attn_res"]["enabled"] = true;
  EXPECT_NO_THROW(config_of(j));

  // Written back with the config.
  const ModelConfig k3 = model_config_of(test::source_dir() / "configs/kimi-k3-tiny.json");
  EXPECT_EQ(k3.to_json()["architecture"], "kimi_k3");
  EXPECT_EQ(ModelConfig::from_json(k3.to_json()).architecture, "kimi_k3");
}

// The computation reads the options only: the name alone changes no logit.
TEST(ModelArchitecture, TheNameAloneChangesNoLogit) {
  json j = config_json("configs/kimi-k3-tiny.json");
  const ModelConfig named = ModelConfig::from_json(j, "k3");
  j["architecture"] = "hyla";
  const ModelConfig own = ModelConfig::from_json(j, "hyla");
  Tensor logits[2];
  for (int i = 0; i < 2; ++i) {
    Model model(i == 0 ? named : own);
    model.initialize(4);
    test::randomize_params(model.params(), 6);
    const ModelInput in = test::random_input(model.config(), {9, 5}, 2);
    logits[i] = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
  }
  ASSERT_EQ(logits[0].numel(), logits[1].numel());
  EXPECT_EQ(std::memcmp(logits[0].data<float>(), logits[1].data<float>(), size_t(logits[0].nbytes())), 0);
}

// A GGUF says its architecture and reads back as a config that names it; a model of hyla's own
// is written only once it names one that has a GGUF, and only if it keeps that one's rules.
TEST(ModelArchitecture, AGgufCarriesItsArchitecture) {
  for (const char* file : {"configs/kimi-k3-tiny.json", "configs/kimi-linear-tiny.json"}) {
    TempDir dir;
    json j = config_json(file);
    const std::string name = j["architecture"];
    j["architecture"] = "hyla";
    ModelConfig config = ModelConfig::from_json(j, file);
    Model model(config);
    model.initialize(1);
    model.save(dir / "model", DType::F32);
    const ModelWeights weights(dir / "model");
    test::expect_error([&] { save_gguf(dir / "m.gguf", config, weights, {}); },
                       "architecture hyla has no llama.cpp GGUF format (the architectures with one: kimi-k3, kimi-linear)");
    EXPECT_FALSE(std::filesystem::exists(dir / "m.gguf"));
    config.architecture = name;
    const GgufExport written = save_gguf(dir / "m.gguf", config, weights, {});
    EXPECT_EQ(written.arch, architecture(name).gguf_arch);
    const ModelConfig read = model_config_of(dir / "m.gguf");
    EXPECT_EQ(read.architecture, name);
    // The other Kimi's name is refused by its rules.
    config.architecture = name == "kimi_k3" ? "kimi_linear" : "kimi_k3";
    test::expect_error([&] { save_gguf(dir / "other.gguf", config, weights, {}); },
                       "not a " + config.architecture + " model");
  }
}

TEST(ModelArchitecture, ConvertNamesTheArchitectureOfItsOutput) {
  TempDir dir;
  json j = config_json("configs/kimi-linear-tiny.json");
  j["architecture"] = "hyla";
  test::write_bytes(dir / "hyla.json", j.dump(1));
  ASSERT_EQ(test::run_hyla(fmt::format("init --config {} --out {}", (dir / "hyla.json").string(), (dir / "m").string())).exit_code, 0);
  const std::string gguf = (dir / "m.gguf").string();
  const test::CommandResult refused =
      test::run_hyla(fmt::format("convert -m {} --out {} --type f32", (dir / "m").string(), gguf));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("hyla convert --architecture"), std::string::npos) << refused.output;
  const test::CommandResult wrong = test::run_hyla(
      fmt::format("convert -m {} --out {} --type f32 --architecture kimi_k3", (dir / "m").string(), gguf));
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("not a kimi_k3 model"), std::string::npos) << wrong.output;
  const test::CommandResult named = test::run_hyla(
      fmt::format("convert -m {} --out {} --type f32 --architecture kimi_linear", (dir / "m").string(), gguf));
  ASSERT_EQ(named.exit_code, 0) << named.output;
  EXPECT_NE(named.output.find("llama.cpp kimi-linear GGUF"), std::string::npos) << named.output;
  // Back to a model directory, the name travels in config.json.
  ASSERT_EQ(test::run_hyla(fmt::format("convert -m {} --out {}", gguf, (dir / "back").string())).exit_code, 0);
  EXPECT_EQ(parse_json_file((dir / "back/config.json").string())["architecture"], "kimi_linear");
}

}  // namespace
}  // namespace hyla
