#include <gtest/gtest.h>

#include "hyla/io/json_fields.h"
#include "hyla/model/model_files.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"
#include "test_util.h"

namespace hyla {
namespace {

using json = nlohmann::json;

ModelConfig load(const std::string& name) {
  return model_config_of((test::source_dir() / "configs" / name).string());
}

// The counts from the config alone equal the sizes of the tensors the model registers, per component.
void expect_counts_match_model(const ModelConfig& config) {
  const ParamCounts counts = count_parameters(config);
  const Model model(config, /*allocate=*/false);
  std::array<int64_t, kNumComponents> created{};
  for (const auto& p : model.params().params()) created[int(p->component)] += p->numel();
  for (int c = 0; c < kNumComponents; ++c)
    EXPECT_EQ(counts.total[c], created[c]) << component_name(Component(c));
  EXPECT_EQ(counts.total_sum(), model.params().numel());
}

TEST(ParamCount, SmallByHand) {
  const ModelConfig c = load("small.json");
  const ParamCounts n = count_parameters(c);
  const int64_t d = 512;
  EXPECT_EQ(n.total[int(Component::Embeddings)], 2 * 8192 * d);
  // KDA: 5 projections [512,512], o_proj, b_proj [8,512], 3 convs [512,1,4], A_log 8, dt_bias 512, o_norm 64.
  const int64_t kda = 6 * 512 * 512 + 8 * 512 + 3 * 512 * 4 + 8 + 512 + 64;
  EXPECT_EQ(n.total[int(Component::Kda)], 6 * kda);
  // MLA: q [512,512], kv_a [128,512], kv_a_norm 128, kv_b [1024,128], g [512,512], o [512,512].
  const int64_t mla = 512 * 512 + 128 * 512 + 128 + 1024 * 128 + 2 * 512 * 512;
  EXPECT_EQ(n.total[int(Component::Mla)], 2 * mla);
  EXPECT_EQ(n.total[int(Component::DenseFfn)], 3 * 512 * 1408);
  EXPECT_EQ(n.total[int(Component::Router)], 7 * (128 * 512 + 128));
  EXPECT_EQ(n.total[int(Component::RoutedExperts)], 7 * 128 * 3 * 512 * 128);
  EXPECT_EQ(n.active[int(Component::RoutedExperts)], 7 * 4 * 3 * 512 * 128);
  EXPECT_EQ(n.total[int(Component::SharedExperts)], 7 * 3 * 512 * 128);
  EXPECT_EQ(n.total[int(Component::AttnRes)], 8 * 4 * d + 2 * d);
  EXPECT_EQ(n.total[int(Component::Norms)], 17 * d);
  EXPECT_EQ(n.total_sum(), 200042544);
  EXPECT_EQ(n.active_sum(), 29386800);
}

TEST(ParamCount, EqualsTensorsTheModelCreates) {
  expect_counts_match_model(load("small.json"));
  expect_counts_match_model(load("nano.json"));
  expect_counts_match_model(load("ling3-tiny.json"));  // per-head MLA gate, shared experts of their own width
  json j = load("nano.json").to_json();
  j["mla"]["q_lora_rank"] = 24;
  j["mla"]["output_gate"] = false;
  j["moe"]["router_latent_dim"] = 16;
  j["moe"]["latent_dim"] = 48;
  j["moe"]["num_shared_experts"] = 2;
  j["moe"]["activation"] = "situ";
  j["moe"]["first_k_dense_replace"] = 0;
  j["tie_word_embeddings"] = true;
  j["attn_res"]["enabled"] = false;
  j["vision"]["enabled"] = true;
  j["vision"]["channels"] = 3;
  expect_counts_match_model(ModelConfig::from_json(j));
}

}  // namespace
}  // namespace hyla
