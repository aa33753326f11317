#include <gtest/gtest.h>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"
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
    ModelConfig::load((dir / "config.json").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ModelConfig::load((dir / "missing.json").string()), Error);
}

}  // namespace
}  // namespace hyla
