// The architecture seam (model/arch/architecture.h): the registry, the name a config carries and
// the rules it brings, the formats that carry it, and the computation that ignores it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
      EXPECT_EQ(architecture_of_hf(json{{"model_type", a->hf_model_type}}), a);
      EXPECT_TRUE(a->config_from_hf && a->hf_tensor) << a->name;
    }
    if (!a->gguf_arch.empty()) {
      EXPECT_TRUE(gguf.insert(a->gguf_arch).second) << a->name;
      EXPECT_EQ(architecture_of_gguf(a->gguf_arch), a);
      EXPECT_TRUE(a->read_gguf && a->write_gguf && a->gguf_tensors) << a->name;
    }
  }
  EXPECT_EQ(architectures().front()->name, "hyla");
  EXPECT_EQ(architecture_of_hf(json{{"model_type", "llama"}}), nullptr);
  EXPECT_EQ(architecture_of_hf(json{{"model_type", "x"}, {"architectures", {"BailingMoeV3ForCausalLM"}}}),
            &architecture("ling3"));
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
                       "architecture hyla has no llama.cpp GGUF format (the architectures with one: kimi-k3, kimi-linear, bailingmoe3)");
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

// Logits of `model` over a fixed sequence, f32.
Tensor logits_of(Model& model) {
  ModelInput in;
  for (int i = 0; i < 40; ++i) in.ids.push_back(int32_t((i * 37 + 11) % model.config().vocab_size));
  in.tokens = TokenBatch::uniform(1, int64_t(in.ids.size()));
  return model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// configs/ling3-tiny.json with random weights everywhere, saved in hyla's directory.
std::unique_ptr<Model> random_ling3(const std::filesystem::path& dir) {
  auto model = std::make_unique<Model>(model_config_of(test::source_dir() / "configs/ling3-tiny.json"));
  model->initialize(1);
  test::randomize_params(model->params(), 7);
  model->save(dir, DType::F32);
  return model;
}

// A Ling 3.0 config.json with the keys llama.cpp's converter reads (scripts/hf-checkpoint.py writes
// the same), for configs/ling3-tiny.json's shape.
json ling3_hf_config(const ModelConfig& c) {
  json limits = json::array(), shared = json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    limits.push_back(c.is_moe_layer(l) ? json(c.moe.swiglu_limit) : json(nullptr));
    shared.push_back(c.is_moe_layer(l) ? json(c.moe.shared_swiglu_limit) : json(nullptr));
  }
  return {{"architectures", {"BailingMoeV3ForCausalLM"}}, {"model_type", "bailing_moe_v3"},
          {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.mla.num_heads}, {"head_dim", c.kda.head_dim},
          {"intermediate_size", c.moe.intermediate_size}, {"rms_norm_eps", c.rms_norm_eps},
          {"rope_theta", c.mla.rope_theta}, {"max_position_embeddings", c.max_position_embeddings},
          {"tie_word_embeddings", false}, {"hidden_act", "silu"}, {"layer_group_size", 4},
          {"short_conv_kernel_size", c.kda.conv_kernel}, {"kda_lower_bound", c.kda.gate_lower_bound},
          {"kda_safe_gate", true}, {"no_kda_lora", true}, {"gated_attention_proj_granularity_type", "head_wise"},
          {"q_lora_rank", c.mla.q_lora_rank}, {"kv_lora_rank", c.mla.kv_lora_rank},
          {"qk_nope_head_dim", c.mla.qk_nope_head_dim}, {"qk_rope_head_dim", c.mla.qk_rope_head_dim},
          {"v_head_dim", c.mla.v_head_dim}, {"num_experts", c.moe.num_experts},
          {"num_experts_per_tok", c.moe.num_experts_per_tok}, {"num_shared_experts", c.moe.num_shared_experts},
          {"moe_intermediate_size", c.moe.moe_intermediate_size},
          {"moe_shared_expert_intermediate_size", c.moe.shared_width()},
          {"first_k_dense_replace", c.moe.first_k_dense_replace}, {"routed_scaling_factor", c.moe.routed_scaling_factor},
          {"norm_topk_prob", true}, {"score_function", "sigmoid"}, {"num_nextn_predict_layers", 1},
          {"expert_swiglu_limit_list", limits}, {"share_expert_swiglu_limit_list", shared}};
}

// hyla's name of a Ling 3.0 tensor as the checkpoint stores it.
std::string ling3_hf_name(const ModelConfig& c, const std::string& name) {
  std::string n = name;
  auto swap = [&](const std::string& from, const std::string& to) {
    const size_t at = n.find(from);
    if (at != std::string::npos) n.replace(at, from.size(), to);
  };
  swap("model.embed_tokens.", "model.word_embeddings.");
  swap(".self_attn.", ".attention.");
  swap(".mlp.gate.e_score_correction_bias", ".mlp.gate.expert_bias");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_attention_layer(l) && n == fmt::format("model.layers.{}.attention.o_proj.weight", l))
      n = fmt::format("model.layers.{}.attention.dense.weight", l);
  return n;
}

// The released layout (config keys, tensor names, an MTP layer past the trunk) reads as the same
// model; what SPEC cannot say is refused by name.
TEST(ModelArchitecture, Ling3CheckpointReadsAsTheSameModel) {
  TempDir dir;
  const auto model = random_ling3(dir / "hyla");
  const ModelConfig& c = model->config();
  std::filesystem::create_directories(dir / "hf");
  std::filesystem::create_directories(dir / "bad");
  test::write_bytes(dir / "hf/config.json", ling3_hf_config(c).dump(1));
  ModelConfig read = model_config_of(dir / "hf/config.json");
  EXPECT_EQ(read.architecture, "ling3");
  json a = read.to_json(), b = c.to_json();
  a["kda"].erase("chunk_size"), b["kda"].erase("chunk_size");
  EXPECT_EQ(a.dump(1), b.dump(1));
  NamedTensors tensors;
  for (const auto& p : model->params().params()) {
    Tensor v = p->value;
    if (p->name.ends_with("conv1d.weight")) v = v.reshape(Shape{p->shape[0], p->shape[2]});
    tensors.emplace_back(ling3_hf_name(c, p->name), v);
  }
  // The multi-token-prediction layer (layer num_hidden_layers), skipped.
  tensors.emplace_back(fmt::format("model.layers.{}.eh_proj.weight", c.num_hidden_layers),
                       Tensor::zeros(DType::F32, {c.hidden_size, 2 * c.hidden_size}));
  tensors.emplace_back(fmt::format("model.layers.{}.attention.q_a_proj.weight", c.num_hidden_layers),
                       Tensor::zeros(DType::F32, {4, 4}));
  save_model_weights(dir / "hf", tensors);
  const auto loaded = Model::load(dir / "hf");
  EXPECT_EQ(max_abs_difference(logits_of(*loaded), logits_of(*model)), 0);

  auto refused = [&](const std::function<void(json&)>& edit, const std::string& what) {
    json j = ling3_hf_config(c);
    edit(j);
    test::write_bytes(dir / "bad/config.json", j.dump(1));
    test::expect_error([&] { model_config_of(dir / "bad/config.json"); }, what);
  };
  refused([](json& j) { j["n_group"] = 8, j["topk_group"] = 4; }, "n_group > 1: grouped routing is not implemented");
  refused([](json& j) { j["expert_swiglu_limit_list"][0] = 5.0; }, "expert_swiglu_limit_list[0] clamps a dense layer");
  refused([](json& j) { j["expert_swiglu_limit_list"][3] = 5.0; }, "expert_swiglu_limit_list differs between layers");
  refused([](json& j) { j["gated_attention_proj_granularity_type"] = "element_wise"; }, "hyla reads \"head_wise\"");
  refused([](json& j) { j["kda_safe_gate"] = false; }, "kda_safe_gate is not true");
  refused([](json& j) { j["score_function"] = "softmax"; }, "SPEC §5's router is a sigmoid");
}

// Written as llama.cpp's bailingmoe3 GGUF and read back: the same config and logits; an MTP layer
// in the file (a converter's output with nextn_predict_layers) is skipped.
TEST(ModelArchitecture, Ling3GgufRoundTripKeepsTheLogits) {
  TempDir dir;
  const auto model = random_ling3(dir / "hyla");
  const GgufExport written = save_gguf(dir / "m.gguf", model->config(), ModelWeights(dir / "hyla"), {});
  EXPECT_EQ(written.arch, "bailingmoe3");
  const ModelConfig read = model_config_of(dir / "m.gguf");
  json a = read.to_json(), b = model->config().to_json();
  a["kda"].erase("chunk_size"), b["kda"].erase("chunk_size");
  // The file holds the eps as f32.
  EXPECT_EQ(read.rms_norm_eps, double(float(model->config().rms_norm_eps)));
  for (json* j : {&a, &b}) (*j).erase("rms_norm_eps"), (*j)["mla"].erase("norm_eps");
  EXPECT_EQ(a.dump(1), b.dump(1));
  const auto loaded = Model::load(dir / "m.gguf");
  EXPECT_LE(max_abs_difference(logits_of(*loaded), logits_of(*model)), 0);

  // The same file with one MTP layer: block_count + 1, nextn_predict_layers 1, blk.8.* tensors.
  const GgufFile g(dir / "m.gguf");
  GgufMetadata meta = g.metadata();
  meta["bailingmoe3.block_count"] = GgufValue::u32(uint32_t(model->config().num_hidden_layers + 1));
  meta["bailingmoe3.nextn_predict_layers"] = GgufValue::u32(1);
  std::vector<GgufTensor> tensors = g.tensors();
  const std::string mtp = fmt::format("blk.{}.", model->config().num_hidden_layers);
  tensors.push_back({mtp + "attn_norm.weight", {model->config().hidden_size}, uint32_t(GgmlType::F32), 0, 0});
  tensors.push_back({mtp + "nextn.eh_proj.weight", {2 * model->config().hidden_size, model->config().hidden_size},
                     uint32_t(GgmlType::F32), 0, 0});
  GgufWriter writer(dir / "mtp.gguf", meta, tensors);
  for (const GgufTensor& t : writer.tensors()) {
    std::vector<uint8_t> bytes(t.bytes, 0);
    if (const GgufTensor* old = g.find(t.name)) std::memcpy(bytes.data(), g.data(*old), t.bytes);
    writer.write(bytes.data(), bytes.size());
  }
  writer.commit();
  EXPECT_EQ(model_config_of(dir / "mtp.gguf").num_hidden_layers, model->config().num_hidden_layers);
  const auto with_mtp = Model::load(dir / "mtp.gguf");
  EXPECT_EQ(max_abs_difference(logits_of(*with_mtp), logits_of(*loaded)), 0);
}

}  // namespace
}  // namespace hyla
