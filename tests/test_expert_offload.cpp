// Expert offload (model/expert_offload.h): an offloaded model computes the resident model's logits
// bit for bit whatever the cache size, policy and prefetch; the policies evict what they say; a
// corrupt expert in the file is an error when it is first needed; the counters add up.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "hyla/core/error.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/expert_offload.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/model.h"
#include "hyla/quant/quantize_model.h"
#include "hyla/serve/metrics.h"
#include "model_test_util.h"
#include "test_util.h"

namespace hyla {
namespace {

namespace fs = std::filesystem;

// nano.json with 16 experts of which tokens choose 2, and three MoE layers: f32 and int8 copies.
class OffloadModel {
 public:
  OffloadModel() {
    config_ = test::nano_config([](nlohmann::json& j) { j["moe"]["num_experts"] = 16; });
    Model model(config_);
    model.initialize(3);
    test::randomize_params(model.params(), 4);
    model.save(dir_ / "f32");
    quantize_model(dir_ / "f32", dir_ / "int8", {});
  }
  fs::path f32() const { return dir_ / "f32"; }
  fs::path int8() const { return dir_ / "int8"; }
  const ModelConfig& config() const { return config_; }

  std::unique_ptr<Model> load(const std::string& memory, ExpertCachePolicy policy = ExpertCachePolicy::Lru,
                              bool prefetch = true) const {
    return Model::load(int8(), {.offload_experts = ExpertOffloadOptions{parse_expert_memory(memory), policy, prefetch}});
  }

 private:
  test::TempDir dir_;
  ModelConfig config_;
};

const OffloadModel& offload_model() {
  static const OffloadModel model;
  return model;
}

std::vector<int32_t> token_ids(int64_t n, unsigned seed, int64_t vocab) {
  std::vector<int32_t> ids;
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t(rng() % uint32_t(vocab)));
  return ids;
}

// The logits of a 24-token prefill (chunks of 8: more experts than a small cache holds) and of 12
// decoded tokens after it.
std::vector<std::vector<float>> prefill_and_decode(Model& model) {
  const int64_t V = model.config().vocab_size;
  SequenceState state(model, 64);
  std::vector<std::vector<float>> out;
  const Tensor prefill = feed(model, token_ids(24, 1, V), state, 8, Precision::BF16);
  out.emplace_back(prefill.data<float>(), prefill.data<float>() + prefill.numel());
  for (int32_t id : token_ids(12, 2, V)) {
    const Tensor logits = feed(model, {id}, state, 1, Precision::BF16);
    out.emplace_back(logits.data<float>(), logits.data<float>() + logits.numel());
  }
  return out;
}

// ModelLoadOptions::bf16_matrices: Linear's matrices held as bf16 alone give the bf16 forward's
// logits bit for bit (with offloaded experts too), and an f32 product names what it lacks.
TEST(ModelLoad, Bf16MatricesGiveTheSameBf16Logits) {
  const OffloadModel& m = offload_model();
  const auto full = Model::load(m.f32());
  const auto lean = Model::load(m.f32(), {.bf16_matrices = true});
  EXPECT_EQ(prefill_and_decode(*lean), prefill_and_decode(*full));
  EXPECT_TRUE(lean->params().get("lm_head.weight").bf16_only);
  EXPECT_FALSE(lean->params().get("lm_head.weight").value.defined());
  EXPECT_FALSE(lean->params().get("model.embed_tokens.weight").bf16_only);  // gathered from f32 rows
  EXPECT_FALSE(lean->params().get("model.layers.2.mlp.experts.0.down_proj.weight").bf16_only);
  SequenceState state(*lean, 8);
  test::expect_error([&] { feed(*lean, {1, 2}, state, 2, Precision::F32); }, "is held as bf16 only");
  const auto offloaded = Model::load(m.int8(), {.offload_experts = ExpertOffloadOptions{parse_expert_memory("50%"),
                                                                                        ExpertCachePolicy::Lru, true},
                                                .bf16_matrices = true});
  EXPECT_EQ(prefill_and_decode(*offloaded), prefill_and_decode(*Model::load(m.int8())));
}

TEST(ExpertMemory, ParsesSizesAndPercentages) {
  EXPECT_EQ(parse_expert_memory("512M").bytes, int64_t(512) << 20);
  EXPECT_EQ(parse_expert_memory("2GiB").bytes, int64_t(2) << 30);
  EXPECT_EQ(parse_expert_memory("1.5K").bytes, 1536);
  EXPECT_EQ(parse_expert_memory("1000000").bytes, 1000000);
  const ExpertMemory quarter = parse_expert_memory("25%");
  EXPECT_DOUBLE_EQ(quarter.fraction, 0.25);
  EXPECT_EQ(quarter.resolve(1000), 250);
  for (const char* bad : {"", "abc", "-5M", "12XB", "0%", "150%", "nan", "1e30G"}) {
    try {
      parse_expert_memory(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--expert-memory"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_expert_cache_policy("mru"), Error);
}

TEST(ExpertOffload, SameLogitsAsTheResidentModelForEveryCacheAndPolicy) {
  const OffloadModel& m = offload_model();
  const auto resident = Model::load(m.int8());
  const std::vector<std::vector<float>> expected = prefill_and_decode(*resident);
  const int64_t k = m.config().moe.num_experts_per_tok, E = m.config().moe.num_experts;
  for (const std::string memory : {"13%", "50%", "100%"})
    for (const ExpertCachePolicy policy : {ExpertCachePolicy::Lru, ExpertCachePolicy::Frequency})
      for (const bool prefetch : {false, true}) {
        SCOPED_TRACE(memory + " " + expert_cache_policy_name(policy) + (prefetch ? " prefetch" : ""));
        const auto model = m.load(memory, policy, prefetch);
        const ExpertOffload& offload = *model->expert_offload();
        EXPECT_GE(offload.slots_per_layer(), k);
        EXPECT_LE(offload.slots_per_layer(), E);
        EXPECT_EQ(prefill_and_decode(*model), expected);  // bit for bit: the same kernels on the same packed bytes
        const ExpertOffloadStats stats = offload.stats();
        const ExpertLayerStats total = stats.total();
        EXPECT_EQ(stats.tokens, 24 + 12);
        ASSERT_EQ(stats.layers.size(), model->moe_layers().size());
        EXPECT_GT(total.requests, 0);
        EXPECT_LE(total.hits, total.requests);
        // Every miss is one fetch; prefetches add fetches of their own.
        EXPECT_GE(total.fetches, total.requests - total.hits);
        EXPECT_EQ(total.fetched_bytes, total.fetches * offload.expert_bytes());
        if (offload.slots_per_layer() == E) {
          EXPECT_LE(total.fetches, E * int64_t(stats.layers.size())) << "a cache of every expert fetches each at most once";
        }
        if (!prefetch) {
          EXPECT_EQ(total.predicted, 0);
        }
        if (prefetch) {
          EXPECT_EQ(stats.layers[0].predicted, 0) << "the first MoE layer has no layer before it to predict it";
          EXPECT_GT(stats.layers[1].predicted, 0);
          EXPECT_LE(total.predicted_used, std::min(total.predicted, total.predicted_needed));
        }
      }
}

TEST(ExpertOffload, LruEvictsTheOldestUseAndFrequencyTheLeastUsed) {
  const OffloadModel& m = offload_model();
  const int64_t E = m.config().moe.num_experts;
  const int64_t layers = int64_t(m.load("100%", ExpertCachePolicy::Lru, false)->moe_layers().size());
  const int64_t expert_bytes = m.load("100%", ExpertCachePolicy::Lru, false)->expert_offload()->expert_bytes();
  const std::string three_slots = std::to_string(3 * expert_bytes * layers);
  // One layer's cache, driven directly: a dispatch that needs expert e alone.
  const auto hits_after = [&](ExpertCachePolicy policy, const std::vector<int>& needs) {
    const auto model = m.load(three_slots, policy, false);
    ExpertOffload& offload = *model->expert_offload();
    EXPECT_EQ(offload.slots_per_layer(), 3);
    ExpertDispatch dispatch;
    dispatch.experts = E;
    for (const int e : needs) {
      dispatch.load.assign(size_t(E), 0);
      dispatch.load[size_t(e)] = 1;
      offload.run(0, dispatch, 0, E, [&](int64_t first, int64_t last, std::span<const PackedExpertWeights> weights) {
        EXPECT_EQ(first, e);
        EXPECT_EQ(last, e + 1);
        EXPECT_NE(std::get<Int8ExpertWeights>(weights[size_t(e)]).gate.data, nullptr);
      });
    }
    return offload.stats().layers[0].hits;
  };
  // 0 three times, then 1 and 2 fill the cache, 3 evicts: LRU drops 0 (used longest ago), frequency
  // drops 1 (used once, before 2). Then 0 again: a hit only under frequency.
  const std::vector<int> needs = {0, 0, 0, 1, 2, 3, 0};
  EXPECT_EQ(hits_after(ExpertCachePolicy::Lru, needs), 2);
  EXPECT_EQ(hits_after(ExpertCachePolicy::Frequency, needs), 3);
}

TEST(ExpertOffload, RefusesFloatExpertsAndACacheSmallerThanATokensExperts) {
  const OffloadModel& m = offload_model();
  try {
    Model::load(m.f32(), {.offload_experts = ExpertOffloadOptions{parse_expert_memory("50%")}});
    ADD_FAILURE() << "float experts were offloaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hyla quantize"), std::string::npos) << e.what();
  }
  try {
    m.load("1K");
    ADD_FAILURE() << "a 1 KiB cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("each token needs 2"), std::string::npos) << e.what();
  }
}

TEST(ExpertOffload, ACorruptExpertInTheFileFailsTheForwardThatNeedsIt) {
  const OffloadModel& m = offload_model();
  test::TempDir dir;
  fs::copy(m.int8(), dir / "model");
  const fs::path file = dir / "model" / "model.safetensors";
  {
    // A NaN scale in every expert of the second MoE layer (which prefetch reads too).
    const SafetensorsFile reader(file);
    std::ifstream in(file, std::ios::binary);
    uint64_t header = 0;
    in.read(reinterpret_cast<char*>(&header), 8);
    in.close();
    std::fstream out(file, std::ios::binary | std::ios::in | std::ios::out);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t e = 0; e < m.config().moe.num_experts; ++e) {
      const SafetensorsEntry* entry =
          reader.find(int8_scale_name("model.layers.2.mlp.experts." + std::to_string(e) + ".down_proj.weight"));
      ASSERT_NE(entry, nullptr);
      out.seekp(std::streamoff(8 + header + entry->begin));
      out.write(reinterpret_cast<const char*>(&nan), sizeof nan);
    }
  }
  const auto model =
      Model::load(dir / "model", {.offload_experts = ExpertOffloadOptions{parse_expert_memory("50%")}});
  SequenceState state(*model, 16);
  for (int attempt = 0; attempt < 2; ++attempt) {  // and the cache is still consistent after the first failure
    try {
      state.reset();
      feed(*model, token_ids(4, 5, m.config().vocab_size), state, 4, Precision::BF16);
      ADD_FAILURE() << "a NaN scale was used";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("int8 scales are finite"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("down_proj.weight.scale"), std::string::npos) << e.what();
    }
  }
}

TEST(ExpertOffload, ColdStartRefetchesAndMetricsReportEveryLayer) {
  const OffloadModel& m = offload_model();
  const auto model = m.load("50%");
  ExpertOffload& offload = *model->expert_offload();
  prefill_and_decode(*model);
  const ExpertOffloadStats warm = offload.stats();
  offload.evict_all(/*drop_page_cache=*/true);
  offload.reset_stats();
  EXPECT_EQ(offload.stats().total().requests, 0);
  prefill_and_decode(*model);
  EXPECT_EQ(offload.stats().total().requests, warm.total().requests);  // same tokens, same routing
  const std::string text = prometheus_metrics(EngineStats{}, ServerCounters{}, 1, offload.stats());
  for (size_t l = 0; l < warm.layers.size(); ++l)
    EXPECT_NE(text.find("hyla_expert_hit_rate{moe_layer=\"" + std::to_string(l) + "\"}"), std::string::npos) << text;
  for (const char* name : {"hyla_expert_prefetch_precision", "hyla_expert_prefetch_recall",
                           "hyla_expert_bytes_read_per_token", "hyla_expert_stall_seconds_per_token"})
    EXPECT_NE(text.find(name), std::string::npos) << name;
}

TEST(ExpertOffload, BenchJsonRowsCarryTheHitRate) {
  const OffloadModel& m = offload_model();
  const test::CommandResult r = test::run_hyla(
      "bench -m " + m.int8().string() + " --expert-memory 25% --expert-cache frequency -p 8 -n 4 -r 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = nlohmann::json::parse(r.output.substr(r.output.find("[\n  {")));
  ASSERT_FALSE(rows.empty());
  for (const auto& row : rows) {
    EXPECT_TRUE(row.contains("expert_hit_rate")) << row.dump();
    EXPECT_EQ(row["expert_cache"], "frequency");
    EXPECT_EQ(row["expert_hit_rate_by_layer"].size(), 3u);
  }
}

}  // namespace
}  // namespace hyla
