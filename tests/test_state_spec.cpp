// One state spec per mixer kind (model/state_spec.h): for every kind alone and in the hybrid
// configs, the spec, the planner's sequence memory and the state inference allocates agree byte
// for byte, the planner counting a windowed layer's rows only up to its window.
#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "hyla/infer/sequence_state.h"
#include "hyla/model/model_files.h"
#include "hyla/model/state_spec.h"
#include "hyla/plan/sequence_memory.h"
#include "test_util.h"

namespace hyla {
namespace {

ModelConfig config_file(const char* name) { return model_config_of((test::source_dir() / "configs" / name).string()); }

struct NamedConfig {
  std::string name;
  ModelConfig config;
};

// Every mixer kind alone (nano's sizes, every layer of that kind), then the hybrid configs.
std::vector<NamedConfig> configs_of_every_kind() {
  std::vector<NamedConfig> configs;
  for (LayerType type : {LayerType::Kda, LayerType::Mla, LayerType::Swa}) {
    ModelConfig single = config_file("nano.json");
    single.layer_types.assign(size_t(single.num_hidden_layers), type);
    configs.push_back({std::string("nano.json, every layer ") + to_string(type), single});
  }
  for (const char* hybrid : {"nano.json", "kimi-linear-tiny.json", "kimi-k3-tiny.json", "ling3-tiny.json"})
    configs.push_back({hybrid, config_file(hybrid)});
  return configs;
}

TEST(StateSpec, SpecPlannerAndAllocatedStateAgreeForEveryMixerKind) {
  for (const auto& [name, config] : configs_of_every_kind()) {
    const Model model(config, /*allocate=*/false);
    for (const DType latent : {DType::BF16, DType::F32}) {
      const int64_t value_bytes = int64_t(dtype_size(latent));
      for (const int64_t tokens : {1, 8, 100}) {
        SCOPED_TRACE(::testing::Message() << name << ", " << dtype_name(latent) << ", " << tokens << " tokens");
        SequenceState state(model, tokens, latent);
        int64_t fixed = 0, per_token = 0;
        double needed_row_bytes = 0;  // the rows a window lets go of are not counted
        for (size_t l = 0; l < config.layer_types.size(); ++l) {
          const StateSpec spec = state_spec(config, config.layer_types[l]);
          fixed += spec.fixed_bytes();
          per_token += spec.values_per_token * value_bytes;
          needed_row_bytes += double(spec.needed_tokens(tokens) * spec.values_per_token * value_bytes);
          // The layer's slot points into the allocated state as the spec lays it out.
          const LayerCache& slot = state.cache().layers[l];
          if (spec.values_per_token > 0) {
            ASSERT_TRUE(std::holds_alternative<LatentCache>(slot));
            EXPECT_EQ(std::get<LatentCache>(slot).capacity, tokens);
          } else {
            ASSERT_TRUE(std::holds_alternative<RecurrentState>(slot));
            const RecurrentState& recurrent = std::get<RecurrentState>(slot);
            EXPECT_EQ(recurrent.state - recurrent.conv_tails, spec.conv_tail_floats);
          }
        }
        EXPECT_EQ(state.fixed_bytes(), fixed);
        EXPECT_EQ(state.bytes_per_token(), per_token);
        EXPECT_EQ(state.allocated_bytes(), fixed + per_token * tokens);

        const SequenceMemory planned = sequence_memory(config, tokens, double(value_bytes));
        EXPECT_EQ(planned.fixed_bytes(), double(fixed));
        EXPECT_EQ(planned.latent_cache_bytes, needed_row_bytes);
        if (tokens <= 8) {  // within nano's window the planner counts every allocated row
          EXPECT_EQ(planned.total_bytes(), double(state.allocated_bytes()));
        }
      }
    }
  }
}

}  // namespace
}  // namespace hyla
