#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <tuple>
#include <cmath>

#include "hyla/model/model_files.h"
#include "hyla/model/model.h"
#include "hyla/core/error.h"
#include "hyla/plan/plan.h"
#include "hyla/plan/plan_report.h"
#include "test_util.h"

namespace hyla {
namespace {

using json = nlohmann::json;

ModelConfig load(const std::string& relative_path) {
  return model_config_of((test::source_dir() / relative_path).string());
}

double relative_error(double value, double reference) { return std::fabs(value / reference - 1); }

// The counts equal the tensors the model registers (names and shapes only, nothing allocated).
void expect_counts_match_model(const ModelConfig& config) {
  const Model model(config, /*allocate=*/false);
  EXPECT_EQ(count_parameters(config).total_sum(), model.params().numel());
}

TEST(PlanParams, FlagshipIsAbout2_8TTotalAnd104BActive) {
  const ModelConfig c = load("configs/flagship-2.8t.json");
  const ParamCounts n = count_parameters(c);
  EXPECT_EQ(n.total_sum(), 2808304853984);
  EXPECT_EQ(n.active_sum(), 105117869024);
  EXPECT_LT(relative_error(double(n.total_sum()), 2.8e12), 0.03);
  EXPECT_LT(relative_error(double(n.active_sum()), 104e9), 0.03);
  // By hand: a routed expert works in the 3584-wide latent space, 3 matrices of 3584 x 3072.
  const int64_t expert = 3 * 3584 * 3072;
  EXPECT_EQ(n.total[int(Component::RoutedExperts)], 93 * 896 * expert);
  EXPECT_EQ(n.active[int(Component::RoutedExperts)], 93 * 16 * expert);
  EXPECT_EQ(n.total[int(Component::SharedExperts)], 93 * 2 * expert);
  // KDA with full-rank f and g: 6 matrices of 12288 x 7168, b_proj, 3 convs, A_log, dt_bias, o_norm.
  const int64_t kda = 6LL * 12288 * 7168 + 96 * 7168 + 3 * 12288 * 4 + 96 + 12288 + 128;
  EXPECT_EQ(n.total[int(Component::Kda)], 69 * kda);
  expect_counts_match_model(c);
}

TEST(PlanParams, DeepSeekV3Within2PercentOfPublic) {
  const ModelConfig c = load("tests/data/deepseek-v3.json");
  const ParamCounts n = count_parameters(c);
  EXPECT_LT(relative_error(double(n.total_sum()), 671e9), 0.02) << n.total_sum();
  EXPECT_LT(relative_error(double(n.active_sum()), 37e9), 0.02) << n.active_sum();
  expect_counts_match_model(c);
}

// Kimi-Linear's KDA layers project f and g through rank-K bottlenecks (kda.gate_rank and
// output_gate_rank = K: f_a_proj [K, d], f_b_proj [H·K, K], likewise g): the count is the released
// model's tensors, exactly.
TEST(PlanParams, KimiLinearIsTheReleasedModel) {
  const ModelConfig c = load("tests/data/kimi-linear-48b-a3b.json");
  const ParamCounts n = count_parameters(c);
  const int64_t d = 2304, H = 32, K = 128, HK = H * K, V = 163840, kda_layers = 20, mla_layers = 7;

  // The released model's tensors, from its modeling code.
  const int64_t kda = 4 * HK * d + 2 * (K * d + HK * K) + H * d + 3 * HK * 4 + H + HK + K;
  const int64_t mla = H * 192 * d + 576 * d + 512 + H * 256 * 512 + d * H * 128;
  const int64_t expert = 3 * d * 1024, router = 256 * d + 256;
  const int64_t shared =
      kda_layers * kda + mla_layers * mla + 3 * d * 9216 + 26 * (expert + router) + d * 55 + 2 * V * d;
  EXPECT_EQ(n.total_sum(), shared + 26 * 256 * expert);
  EXPECT_EQ(n.active_sum(), shared + 26 * 8 * expert);
  // llama.cpp reports 49.12 B parameters for the released checkpoint.
  EXPECT_LT(relative_error(double(n.total_sum()), 49.12e9), 0.001) << n.total_sum();
  expect_counts_match_model(c);
}

// Kimi K3 as released (configs/kimi-k3.json): 2.8T total. Routed experts in the 3584-wide latent
// space; shared experts at full width on u (moe.shared_full_width); one dense SiTU layer; the
// decay gate through rank 128, the output gate full rank.
TEST(PlanParams, KimiK3IsAbout2_8T) {
  const ModelConfig c = load("configs/kimi-k3.json");
  const ParamCounts n = count_parameters(c);
  const int64_t d = 7168, HK = 96 * 128, moe_layers = 92;
  EXPECT_EQ(n.total[int(Component::RoutedExperts)], moe_layers * 896 * 3 * 3584 * 3072LL);
  EXPECT_EQ(n.active[int(Component::RoutedExperts)], moe_layers * 16 * 3 * 3584 * 3072LL);
  EXPECT_EQ(n.total[int(Component::SharedExperts)], moe_layers * 2 * 3 * d * 3072LL);
  EXPECT_EQ(n.total[int(Component::DenseFfn)], 3 * d * 33792LL);
  const int64_t kda = 5LL * HK * d + (128 * d + HK * 128) + 96 * d + 3 * HK * 4 + 96 + HK + 128;
  EXPECT_EQ(n.total[int(Component::Kda)], 69 * kda);
  EXPECT_LT(relative_error(double(n.total_sum()), 2.8e12), 0.03) << n.total_sum();
  expect_counts_match_model(c);
}

PlanOptions options_on(const std::string& gpu) {
  PlanOptions o;
  o.gpu = parse_gpu(gpu);
  return o;
}

TEST(Plan, SmallByHand) {
  const ModelConfig c = load("configs/small.json");
  PlanOptions o = options_on("custom:1,2,100");  // 1 GB, 2 TB/s, 100 TFLOP/s
  o.context = 1000;
  o.batch = 3;
  const Plan p = make_plan(c, o);
  const int64_t total = 200042544, active = 29386800;
  EXPECT_DOUBLE_EQ(p.weight_bytes, 2.0 * total);
  EXPECT_EQ(p.matmul_params, active - 8192 * 512);

  // 2 latent layers x 1000 tokens x 128 values x 2 B; 6 KDA layers of 8 heads x 64 x 64 f32 states
  // and 3 x 512 channels x 3 f32 conv tails.
  EXPECT_DOUBLE_EQ(p.sequence.latent_cache_bytes, 2 * 1000 * 128 * 2);
  EXPECT_DOUBLE_EQ(p.sequence.kda_state_bytes, 6 * 8 * 64 * 64 * 4);
  EXPECT_DOUBLE_EQ(p.sequence.conv_tail_bytes, 6 * 3 * 512 * 3 * 4);
  EXPECT_DOUBLE_EQ(p.sequence.mha_attention_layers_bytes, 2 * 1000 * 8 * (64 + 64) * 2);
  EXPECT_DOUBLE_EQ(p.sequence.mha_all_layers_bytes, 8 * 1000 * 8 * (64 + 64) * 2);

  // Prefill: 2 layers x 8 heads x (64 + 64) over a mean of 500.5 positions; decode (absorbed)
  // 2 x 8 x (2 x 128) over 1000 positions; KDA decode 6 layers x 8 heads x 6 x 64 x 64.
  EXPECT_DOUBLE_EQ(p.flops.weights, 2.0 * double(active - 8192 * 512));
  EXPECT_DOUBLE_EQ(p.flops.mla_prefill, 2 * 2 * 8 * 128 * 500.5);
  EXPECT_DOUBLE_EQ(p.flops.mla_decode, 2 * 2 * 8 * 256 * 1000);
  EXPECT_DOUBLE_EQ(p.flops.kda_decode, 6 * 8 * 6 * 64 * 64);
  EXPECT_DOUBLE_EQ(p.flops.kda_prefill, 6 * 8 * (6 * 64 * 64 + 64 * 5 * 64 + 64 * 64 / 3.0));

  // 400 MB of weights + 3 sequences fit in 0.9 GB: one GPU.
  EXPECT_DOUBLE_EQ(p.deployment.needed_bytes, 2.0 * total + 3 * p.sequence.total_bytes());
  EXPECT_EQ(p.deployment.min_gpus, 1);
  EXPECT_DOUBLE_EQ(p.prefill_seconds, 1000 * p.flops.prefill() / (100e12 * 0.4));

  // Decode: 3 tokens each pick 4 of 128 experts in each of 7 MoE layers.
  const double touched = 128 * (1 - std::pow(1 - 4.0 / 128, 3));
  EXPECT_DOUBLE_EQ(p.decode.experts_touched_per_layer, touched);
  EXPECT_DOUBLE_EQ(p.decode.expert_bytes, 7 * touched * (3 * 512 * 128) * 2);
  EXPECT_DOUBLE_EQ(p.decode.dense_bytes, 2.0 * double(total - 7 * 128 * 3 * 512 * 128 - 8192 * 512));
  EXPECT_DOUBLE_EQ(p.decode.cache_bytes, 3 * (p.sequence.latent_cache_bytes + 2 * p.sequence.fixed_bytes()));
  // One GPU reads the step at 2 TB/s and computes 3 tokens at 100 TFLOP/s; each sequence gets one.
  EXPECT_DOUBLE_EQ(p.decode.bandwidth_seconds, p.decode.total_bytes() / 2e12);
  EXPECT_DOUBLE_EQ(p.decode.compute_seconds, 3 * p.flops.decode() / 100e12);
  EXPECT_DOUBLE_EQ(p.decode.bandwidth_bound().per_sequence, 2e12 / p.decode.total_bytes());
  EXPECT_DOUBLE_EQ(p.decode.bandwidth_bound().deployment, 3 * 2e12 / p.decode.total_bytes());
  EXPECT_DOUBLE_EQ(p.decode.bandwidth_bound().per_gpu, 3 * 2e12 / p.decode.total_bytes());
  EXPECT_DOUBLE_EQ(p.decode.compute_bound().per_gpu, 100e12 / p.flops.decode());

  // Training: 16 B per parameter; ZeRO-1 keeps 4 B per parameter on every GPU.
  EXPECT_DOUBLE_EQ(p.training.state_bytes, 16.0 * total);
  EXPECT_EQ(p.training.zero3_gpus, int64_t(std::ceil(16.0 * total / 0.9e9)));
  EXPECT_EQ(p.training.zero1_gpus, int64_t(std::ceil(12.0 * total / (0.9e9 - 4.0 * total))));
}

TEST(Plan, SlidingWindowLayersKeepOnlyTheWindow) {
  json j = load("configs/small.json").to_json();
  j["layer_types"][3] = "swa";
  j["mla"]["sliding_window"] = 100;
  PlanOptions o;
  o.context = 1000;
  const Plan p = make_plan(ModelConfig::from_json(j), o);
  EXPECT_DOUBLE_EQ(p.sequence.latent_cache_bytes, (1000 + 100) * 128 * 2);
  // Prompt positions 1..1000 attend min(t, 100): (100·101/2 + 900·100) / 1000 = 95.05 on average.
  EXPECT_DOUBLE_EQ(p.flops.mla_prefill, 2 * 8 * 128 * (500.5 + 95.05));
  EXPECT_DOUBLE_EQ(p.flops.mla_decode, 2 * 8 * 256 * (1000 + 100));
}

TEST(Plan, MemoryGrowsTheGpuCount) {
  const ModelConfig c = load("configs/flagship-2.8t.json");
  PlanOptions o;
  const Plan bf16 = make_plan(c, o);
  o.weights = parse_weight_format("int8");
  const Plan int8 = make_plan(c, o);
  // Resident weights are all 2.8T parameters, at a byte each plus one f32 scale per 128.
  EXPECT_DOUBLE_EQ(int8.weight_bytes, 2808304853984 * (1 + 4.0 / 128));
  EXPECT_LT(int8.deployment.min_gpus, bf16.deployment.min_gpus);
  o.batch = 64;
  const Plan batched = make_plan(c, o);
  EXPECT_GT(batched.deployment.min_gpus, int8.deployment.min_gpus);
  // More sequences touch more distinct experts, never more than exist.
  EXPECT_GT(batched.decode.experts_touched_per_layer, 16 * 30);
  EXPECT_LT(batched.decode.experts_touched_per_layer, 896);
}

// The flagship's batch-1 decode on 45 H200s: every GPU reads its 1/45 of the step's bytes at the
// same time, so the one sequence gets 45 GPUs' bandwidth, and per GPU is that over 45.
TEST(Plan, DecodeBoundsSayWhoReadsWhat) {
  const Plan p = make_plan(load("configs/flagship-2.8t.json"), PlanOptions{});
  ASSERT_EQ(p.decode.gpus, 45);
  const double one_gpu_reading_all = 4.8e12 / p.decode.total_bytes();
  const DecodeRate bound = p.decode.upper_bound();
  EXPECT_DOUBLE_EQ(bound.per_sequence, 45 * one_gpu_reading_all);
  EXPECT_DOUBLE_EQ(bound.deployment, bound.per_sequence);
  EXPECT_DOUBLE_EQ(bound.per_gpu, one_gpu_reading_all);
  EXPECT_NEAR(bound.per_sequence, 908, 1);
  EXPECT_NEAR(bound.per_gpu, 20.2, 0.05);
  // A batch of 8 shares the weight reads: each sequence slower than alone, the deployment faster.
  PlanOptions o;
  o.batch = 8;
  const Plan batched = make_plan(load("configs/flagship-2.8t.json"), o);
  EXPECT_LT(batched.decode.upper_bound().per_sequence, bound.per_sequence);
  EXPECT_GT(batched.decode.upper_bound().deployment, bound.deployment);
  EXPECT_DOUBLE_EQ(batched.decode.upper_bound().deployment, 8 * batched.decode.upper_bound().per_sequence);
}

// The flagship int8 on one 8 x H200 node with 2 TB of host RAM (docs/plan.md "Expert offload"):
// the experts that do not fit HBM after the rest live in host RAM, and the step reads its misses
// over the 8 PCIe links.
TEST(Plan, ExpertTiersOfAnEightGpuBox) {
  PlanOptions o;
  o.weights = parse_weight_format("int8");
  o.context = 131072;
  o.box_gpus = 8;
  o.host_memory_bytes = 2048e9;
  const Plan p = make_plan(load("configs/flagship-2.8t.json"), o);
  ASSERT_TRUE(p.experts);
  const ExpertPlacement& x = *p.experts;
  const double b = o.weights.bytes_per_value;
  const double experts = double(p.params.total[int(Component::RoutedExperts)]) * b;
  EXPECT_DOUBLE_EQ(x.expert_bytes, experts);
  const double hbm = 8 * 0.9 * o.gpu.memory_bytes - (p.weight_bytes - experts) - p.sequence.total_bytes();
  ASSERT_EQ(x.tiers.size(), 4u);
  EXPECT_NEAR(x.tiers[0].expert_bytes, hbm, 1e3);
  EXPECT_NEAR(x.tiers[1].expert_bytes, experts - hbm, 1e3);  // the rest fits 2 TB
  EXPECT_EQ(x.tiers[2].expert_bytes, 0);
  EXPECT_EQ(x.tiers[3].expert_bytes, 0);
  EXPECT_NEAR(x.tiers[0].share + x.tiers[1].share, 1.0, 1e-12);
  // Batch 1 touches k experts per MoE layer; their misses all come from host RAM at 8 x 50 GB/s.
  EXPECT_NEAR(x.touched_bytes / (93.0 * 16 * 3 * 3584 * 3072 * b), 1.0, 1e-12);
  EXPECT_NEAR(x.miss_seconds, x.touched_bytes / 400e9, 1e-12);
  EXPECT_NEAR(x.resident_step_seconds, p.decode.total_bytes() / (8 * o.gpu.bandwidth_bytes_per_s), 1e-12);
  const double needed = x.hit_rate_for_resident_speed();
  EXPECT_NEAR(x.step_seconds(needed), x.resident_step_seconds, 1e-12);
  EXPECT_GT(x.step_seconds(x.uniform_hit_rate()), 10 * x.resident_step_seconds);
  EXPECT_DOUBLE_EQ(x.uniform_hit_rate(), x.tiers[0].share);
  const json j = plan_json(p);
  EXPECT_DOUBLE_EQ(j["expert_offload"]["hit_rate_for_resident_speed"].get<double>(), needed);
  EXPECT_NE(plan_text(p).find("host RAM"), std::string::npos);

  o.box_gpus = 1;  // the other weights (56B parameters at int8) do not fit one 40 GB GPU
  o.gpu = parse_gpu("custom:40,2,300");
  EXPECT_THROW(make_plan(load("configs/flagship-2.8t.json"), o), Error);
}

// make_plan's error for `o` names `what`.
void expect_plan_error(const ModelConfig& c, const PlanOptions& o, const std::string& what) {
  try {
    make_plan(c, o);
    FAIL() << "no error; expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Plan, RejectsOptionsOutOfRange) {
  const ModelConfig c = load("configs/small.json");
  auto expect_error = [&c](const PlanOptions& o, const std::string& what) { expect_plan_error(c, o, what); };
  PlanOptions o;
  o.context = c.max_position_embeddings + 1;
  expect_error(o, "--context 1048577: must lie in [1, max_position_embeddings = 1048576]");
  o = {};
  o.batch = 0;
  expect_error(o, "--batch 0: must be at least 1");
  o = {};
  o.mfu = 1.5;
  expect_error(o, "--mfu 1.5");
  o = {};
  o.train_tokens = 0;
  expect_error(o, "--train-tokens 0");
  o = {};
  o.train_seq_len = 0;
  expect_error(o, "--train-seq-len 0");
}

// small.json trained on DP 2 x EP 4 = 8 GPUs in NVLink domains of 2, so that every collective
// uses both links: 8 x 4,096 tokens per step, micro-batches of 1,024.
PlanOptions small_layout() {
  PlanOptions o = options_on("custom:1,2,100");  // 100 TFLOP/s
  o.train_seq_len = 1024;
  CommOptions comm;
  comm.dp = 2;
  comm.ep = 4;
  comm.nvlink = parse_fabric("custom:100,1", "--nvlink");     // 100 GB/s, 1 us per step
  comm.scale_out = parse_fabric("custom:10,5", "--fabric");  // 10 GB/s, 5 us per step
  comm.nvlink_domain = 2;
  comm.batch_tokens = 8 * 4096;
  o.comm = comm;
  return o;
}

TEST(PlanComm, SmallByHand) {
  const Plan p = make_plan(load("configs/small.json"), small_layout());
  ASSERT_TRUE(p.communication);
  const Communication& x = *p.communication;
  EXPECT_EQ(x.gpus, 8);
  EXPECT_DOUBLE_EQ(x.tokens_per_gpu, 4096);
  EXPECT_EQ(x.micro_batches, 4);

  // A token's 4 rows of 512 bf16 values out and back, 3 of 4 experts' GPUs elsewhere.
  EXPECT_EQ(x.expert_width, 512);
  EXPECT_DOUBLE_EQ(x.all_to_all_bytes_per_token_layer, 2 * 4 * 512 * 2 * 3 / 4.0);
  // 4,096 tokens x 7 MoE layers x forward and backward; of the 3 other GPUs of the group, 1 shares
  // the domain. 4 all-to-alls per micro-batch and layer, each 1 NVLink step and 2 NIC steps.
  const double rows = 2 * 4 * 512 * 2, token_layers = 2 * 4096 * 7;
  EXPECT_DOUBLE_EQ(x.all_to_all.nvlink_bytes, token_layers * rows * 1 / 4);
  EXPECT_DOUBLE_EQ(x.all_to_all.scale_out_bytes, token_layers * rows * 2 / 4);
  EXPECT_DOUBLE_EQ(x.all_to_all.nvlink_steps, 4 * 4 * 7 * 1);
  EXPECT_DOUBLE_EQ(x.all_to_all.scale_out_steps, 4 * 4 * 7 * 2);

  // 200,042,544 parameters, 176,160,768 of them routed experts (7 layers x 128 x 3 x 512 x 128).
  const int64_t routed = 7 * 128 * 3 * 512 * 128, replicated = 200042544 - routed;
  EXPECT_EQ(x.replicated_params, replicated);
  EXPECT_EQ(x.expert_params_per_gpu, routed / 4);
  // All but the experts over 8 GPUs, 2 per domain (4 domains): 2·7/8 of the f32 bytes in all, the
  // 2·1/2 of the in-domain reduce-scatter + all-gather over NVLink, 2·3/4 of half over the NIC.
  const double S = 4.0 * double(replicated);
  EXPECT_DOUBLE_EQ(x.replicated_gradients.nvlink_bytes, S);
  EXPECT_DOUBLE_EQ(x.replicated_gradients.scale_out_bytes, 0.75 * S);
  EXPECT_DOUBLE_EQ(x.replicated_gradients.bytes(), 2 * 7 / 8.0 * S);
  EXPECT_DOUBLE_EQ(x.replicated_gradients.nvlink_steps, 2);
  EXPECT_DOUBLE_EQ(x.replicated_gradients.scale_out_steps, 6);
  // The experts over the 2 GPUs that hold the same quarter, 4 apart: different domains.
  const double Se = 4.0 * double(routed / 4);
  EXPECT_DOUBLE_EQ(x.expert_gradients.nvlink_bytes, 0);
  EXPECT_DOUBLE_EQ(x.expert_gradients.scale_out_bytes, Se);
  EXPECT_DOUBLE_EQ(x.expert_gradients.scale_out_steps, 2);
  EXPECT_DOUBLE_EQ(x.gradient_bytes(), 1.75 * S + Se);

  // ZeRO-1: 4 B whole and 12 B over the GPUs that reduce them.
  EXPECT_DOUBLE_EQ(x.state_bytes_per_gpu, double(replicated) * (4 + 12 / 8.0) + double(routed / 4) * (4 + 12 / 2.0));

  const double flops = 6.0 * double(p.matmul_params) + 3 * p.training.flops_per_token.prefill_attention();
  EXPECT_DOUBLE_EQ(x.compute_seconds, 4096 * flops / (100e12 * 0.4));
  const double a2a = token_layers * rows / 4 / 100e9 + token_layers * rows / 2 / 10e9 + 112 * 1e-6 + 224 * 5e-6;
  const double grads = S / 100e9 + 0.75 * S / 10e9 + 2 * 1e-6 + 6 * 5e-6 + Se / 10e9 + 2 * 5e-6;
  EXPECT_NEAR(x.all_to_all_seconds, a2a, 1e-15);
  EXPECT_NEAR(x.gradient_seconds, grads, 1e-15);
  EXPECT_NEAR(x.latency_seconds, 112 * 1e-6 + 224 * 5e-6 + 2 * 1e-6 + 6 * 5e-6 + 2 * 5e-6, 1e-15);
  EXPECT_DOUBLE_EQ(x.step_seconds_no_overlap(), x.compute_seconds + a2a + grads);
  EXPECT_DOUBLE_EQ(x.step_seconds_full_overlap(), std::max(x.compute_seconds, a2a + grads));
  EXPECT_DOUBLE_EQ(x.share_no_overlap(), (a2a + grads) / (x.compute_seconds + a2a + grads));

  const json j = plan_json(p)["communication"];
  EXPECT_DOUBLE_EQ(j["all_to_all_bytes_per_token_per_moe_layer"].get<double>(), 6144);
  EXPECT_DOUBLE_EQ(j["gradient_bytes_per_gpu_per_step"].get<double>(), x.gradient_bytes());
  EXPECT_EQ(j["needed_bandwidth_link"], "scale_out");
  EXPECT_NE(plan_text(p).find("communication (training on DP 2 x EP 4 = 8 GPUs"), std::string::npos);
}

// The latent MoE sends its experts' 3584-wide inputs, not the 7168-wide residual stream.
TEST(PlanComm, FlagshipSendsTheLatentRows) {
  PlanOptions o;
  o.comm = CommOptions{};
  o.comm->dp = 8;
  o.comm->ep = 128;
  const Communication x = *make_plan(load("configs/flagship-2.8t.json"), o).communication;
  EXPECT_EQ(x.expert_width, 3584);
  EXPECT_DOUBLE_EQ(x.all_to_all_bytes_per_token_layer, 2 * 16 * 3584 * 2 * 127 / 128.0);
  // Groups of 128 span 16 domains of 8: 7 of the 127 peers on NVLink.
  EXPECT_NEAR(x.all_to_all.nvlink_bytes / x.all_to_all.bytes(), 7 / 127.0, 1e-12);
  EXPECT_EQ(x.expert_params_per_gpu, 2752335839232 / 128);
}

TEST(PlanComm, OneGpuPerKindSendsNothingOfThatKind) {
  const ModelConfig c = load("configs/small.json");
  PlanOptions o = small_layout();
  o.comm->ep = 1;  // pure data parallelism: no all-to-all
  const Communication dp_only = *make_plan(c, o).communication;
  EXPECT_EQ(dp_only.all_to_all.bytes(), 0);
  EXPECT_EQ(dp_only.all_to_all_seconds, 0);
  EXPECT_EQ(dp_only.all_to_all_bytes_per_token_layer, 0);
  EXPECT_GT(dp_only.expert_gradients.bytes(), 0);

  // DP = 1: every expert has one copy, so expert gradients stay put; the EP GPUs still train on
  // different tokens, so the replicated parameters' gradients are reduced over them.
  o.comm->dp = 1;
  o.comm->ep = 4;
  const Communication ep_only = *make_plan(c, o).communication;
  EXPECT_EQ(ep_only.expert_gradients.bytes(), 0);
  EXPECT_EQ(ep_only.expert_gradients.seconds(o.comm->nvlink, o.comm->scale_out), 0);
  EXPECT_DOUBLE_EQ(ep_only.replicated_gradients.bytes(), 2 * 3 / 4.0 * 4 * double(ep_only.replicated_params));

  o.comm->ep = 1;  // one GPU: nothing at all
  const Communication one = *make_plan(c, o).communication;
  EXPECT_EQ(one.gradient_bytes(), 0);
  EXPECT_EQ(one.comm_seconds(), 0);
  EXPECT_EQ(one.needed_bandwidth_bytes_per_s, 0);
  EXPECT_DOUBLE_EQ(one.step_seconds_no_overlap(), one.compute_seconds);
}

// Plugging the needed bandwidth back in as the fabric makes communication exactly the target share.
TEST(PlanComm, NeededBandwidthMeetsTheTarget) {
  const auto share_with = [](const ModelConfig& c, PlanOptions o, bool on_nvlink) {
    const Communication x = *make_plan(c, o).communication;
    EXPECT_EQ(x.needed_on_nvlink, on_nvlink);
    Fabric& sized = on_nvlink ? o.comm->nvlink : o.comm->scale_out;
    sized.bandwidth_bytes_per_s = x.needed_bandwidth_bytes_per_s;
    return make_plan(c, o).communication->share_no_overlap();
  };
  const ModelConfig flagship = load("configs/flagship-2.8t.json");
  PlanOptions o;
  o.comm = CommOptions{};
  o.comm->dp = 8;
  o.comm->ep = 128;
  for (const double target : {0.15, 0.3, 0.5}) {
    o.comm->target_share = target;
    EXPECT_NEAR(share_with(flagship, o, false), target, 1e-12) << target;
  }
  // 5% of the step is less than the all-to-alls' latency and the NVLink part: out of reach.
  o.comm->target_share = 0.05;
  EXPECT_TRUE(std::isinf(make_plan(flagship, o).communication->needed_bandwidth_bytes_per_s));
  // Inside one domain the NVLink is what to size.
  PlanOptions inside = small_layout();
  inside.comm->dp = 2;
  inside.comm->ep = 4;
  inside.comm->nvlink_domain = 8;
  EXPECT_NEAR(share_with(load("configs/small.json"), inside, true), 0.15, 1e-12);

  // A latency that alone exceeds the allowed time: no bandwidth is enough.
  inside.comm->nvlink = parse_fabric("custom:100,100000", "--nvlink");
  const Plan slow = make_plan(load("configs/small.json"), inside);
  EXPECT_TRUE(std::isinf(slow.communication->needed_bandwidth_bytes_per_s));
  EXPECT_TRUE(plan_json(slow)["communication"]["needed_bandwidth_bytes_per_s"].is_null());
}

TEST(PlanComm, RejectsLayoutsAndFabricsOutOfRange) {
  const ModelConfig c = load("configs/small.json");
  auto expect_error = [&c](const PlanOptions& o, const std::string& what) { expect_plan_error(c, o, what); };
  PlanOptions o = small_layout();
  o.comm->ep = 3;
  expect_error(o, "--ep 3: must divide the 128 routed experts");
  o = small_layout();
  o.comm->dp = 0;
  expect_error(o, "--dp 0: must be at least 1");
  o = small_layout();
  o.comm->nvlink_domain = 0;
  expect_error(o, "--nvlink-domain 0: must be at least 1");
  for (const double target : {0.0, 1.0, -0.5}) {
    o = small_layout();
    o.comm->target_share = target;
    expect_error(o, fmt::format("--comm-target {}: must lie in (0, 1)", target));
  }
  o = small_layout();
  o.comm->batch_tokens = 4;
  expect_error(o, "--batch-tokens 4: must give every one of the 8 GPUs at least one token");
  json dense = c.to_json();
  dense["moe"]["first_k_dense_replace"] = 8;
  o = small_layout();
  try {
    make_plan(ModelConfig::from_json(dense), o);
    FAIL() << "no error for --ep on a dense config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ep 4: the config has no MoE layers"), std::string::npos) << e.what();
  }

  const Fabric ndr = parse_fabric("ib-ndr400", "--fabric");
  EXPECT_DOUBLE_EQ(ndr.bandwidth_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(parse_fabric("nvlink5", "--fabric").bandwidth_bytes_per_s, 900e9);
  const Fabric custom = parse_fabric("custom:12.5,2", "--fabric");
  EXPECT_DOUBLE_EQ(custom.bandwidth_bytes_per_s, 12.5e9);
  EXPECT_DOUBLE_EQ(custom.latency_seconds, 2e-6);
  EXPECT_DOUBLE_EQ(parse_fabric("custom:25", "--fabric").latency_seconds, 0);
  for (const char* bad : {"ib-xdr", "custom:", "custom:0", "custom:-5", "custom:50,", "custom:50,x", "custom:50,1,2"})
    EXPECT_THROW(parse_fabric(bad, "--fabric"), Error) << bad;
  try {
    parse_fabric("ib-xdr", "--nvlink");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--nvlink: unknown fabric 'ib-xdr' (known: nvlink4, ", 0), 0u) << e.what();
  }
}

// A token's k experts (distinct) over N hosts of E/N each: the busiest host's expected count,
// against every choice enumerated.
TEST(PlanHosts, BusiestHostExpertsMatchEnumeration) {
  for (const auto& [experts, chosen, hosts] : {std::tuple{8, 3, 2}, {8, 3, 4}, {12, 4, 3}, {10, 5, 5}, {6, 6, 2}}) {
    double total = 0, count = 0;
    for (uint32_t mask = 0; mask < (1u << experts); ++mask) {
      if (std::popcount(mask) != chosen) continue;
      int busiest = 0;
      for (int h = 0; h < hosts; ++h) {
        const int each = experts / hosts;
        busiest = std::max(busiest, std::popcount(mask & (((1u << each) - 1) << (h * each))));
      }
      total += busiest;
      ++count;
    }
    EXPECT_NEAR(expected_busiest_host_experts(experts, chosen, hosts), total / count, 1e-12)
        << experts << " " << chosen << " " << hosts;
  }
  EXPECT_DOUBLE_EQ(expected_busiest_host_experts(896, 16, 1), 16);
  test::expect_error([] { expected_busiest_host_experts(10, 2, 3); }, "10 experts over 3 hosts");
}

// configs/small.json over 1 and 2 hosts, every figure by hand (docs/distributed.md's formulas).
TEST(PlanHosts, SmallByHand) {
  const ModelConfig c = load("configs/small.json");
  PlanOptions o;
  o.context = 1000;
  HostsOptions h;
  h.network = parse_network("10,5", "--network");
  h.memory_bytes = 1e9;
  h.bandwidth_bytes_per_s = 100e9;
  h.flops = 1e12;
  h.disk_bandwidth_bytes_per_s = 2e9;
  h.dense_weights = parse_weight_format("bf16");
  h.expert_weights = parse_weight_format("mxfp4");
  h.hosts = 2;
  o.hosts = h;
  const Plan p = make_plan(c, o);
  const double total = 200042544, routed = 7 * 128 * 3 * 512 * 128, lookup = 8192 * 512;
  const double mxfp4 = 0.5 + 1.0 / 32, d = 512, V = 8192;
  for (const HostsPlan* x : {&*p.hosts, &*p.one_host}) {
    const double n = double(x->hosts);
    EXPECT_DOUBLE_EQ(x->dense_bytes, 2 * (total - routed) / n);
    EXPECT_DOUBLE_EQ(x->expert_bytes, mxfp4 * routed / n);
    EXPECT_DOUBLE_EQ(x->state_bytes, p.sequence.latent_cache_bytes + p.sequence.fixed_bytes() / n);
    EXPECT_DOUBLE_EQ(x->resident_expert_share, 1);  // a few hundred MB in 0.9 GB
    EXPECT_DOUBLE_EQ(x->compute_seconds, p.flops.decode() / (n * 1e12));
    EXPECT_DOUBLE_EQ(x->disk_seconds, 0);
  }
  const HostsPlan& two = *p.hosts;
  const HostsPlan& one = *p.one_host;
  // One host exchanges nothing and reads 4 of 128 experts a layer.
  EXPECT_EQ(one.collectives_per_token, 0);
  EXPECT_DOUBLE_EQ(one.network_seconds, 0);
  EXPECT_DOUBLE_EQ(one.experts_read_per_layer, 4);
  // Two: the embedding's and 2 x 8 layers' d-row all-reduces (f32, 2 (N-1)/N of the row each), no
  // latent MoE, and the logits' gather; one hop each.
  EXPECT_EQ(two.collectives_per_token, 1 + 16 + 1);
  EXPECT_DOUBLE_EQ(two.sent_bytes_per_token, 17 * 2 * 0.5 * 4 * d + 0.5 * 4 * V);
  EXPECT_DOUBLE_EQ(two.network_seconds, 18 * 5e-6 + two.sent_bytes_per_token / 10e9);
  EXPECT_DOUBLE_EQ(two.experts_read_per_layer, expected_busiest_host_experts(128, 4, 2));
  const double expert_params = 3 * 512 * 128;
  EXPECT_DOUBLE_EQ(two.read_bytes, 2 * (total - routed - lookup) / 2 +
                                       7 * two.experts_read_per_layer * expert_params * mxfp4 +
                                       p.sequence.latent_cache_bytes + 2 * p.sequence.fixed_bytes() / 2);
  EXPECT_DOUBLE_EQ(two.memory_seconds, two.read_bytes / 100e9);
  EXPECT_DOUBLE_EQ(two.step_seconds(), std::max(two.memory_seconds, two.compute_seconds) + two.network_seconds);
  // Prefill: compute per token (this model reads little), the rows' bytes and a chunk's share of the latency.
  EXPECT_DOUBLE_EQ(two.prefill_compute_seconds_per_token, p.flops.prefill() / 2e12);
  EXPECT_DOUBLE_EQ(two.prefill_network_seconds_per_token, 17 * 2 * 0.5 * 4 * d / 10e9 + 18 * 5e-6 / 512);
  EXPECT_GT(two.decode_tokens_per_s_per_sequence(), one.decode_tokens_per_s_per_sequence());
}

// Experts that do not fit a host's RAM are read from its disk; the dense share must fit.
TEST(PlanHosts, WhatDoesNotFitIsReadFromDisk) {
  const ModelConfig c = load("configs/kimi-k3.json");
  PlanOptions o;
  o.context = 8192;
  o.weights = parse_weight_format("q8_0");
  HostsOptions h;
  h.network = parse_network("12.5,5", "--network");
  h.memory_bytes = 768e9;
  h.bandwidth_bytes_per_s = 400e9;
  h.disk_bandwidth_bytes_per_s = 28e9;
  h.dense_weights = o.weights;
  h.hosts = 2;
  o.hosts = h;
  const Plan p = make_plan(c, o);
  const double usable = 0.9 * 768e9;
  EXPECT_NEAR(p.hosts->resident_expert_share, (usable - p.hosts->dense_bytes - p.hosts->state_bytes) / p.hosts->expert_bytes,
              1e-12);
  EXPECT_LT(p.hosts->resident_expert_share, 1);
  EXPECT_GT(p.hosts->disk_seconds, 0);
  EXPECT_LT(p.one_host->resident_expert_share, p.hosts->resident_expert_share);
  // K3's latent MoE adds two latent-width collectives per MoE layer.
  const int64_t moe_layers = c.num_hidden_layers - c.moe.first_k_dense_replace;
  EXPECT_EQ(p.hosts->collectives_per_token, 1 + 2 * c.num_hidden_layers + 2 * moe_layers + 1);
  o.hosts->memory_bytes = 1e9;
  EXPECT_FALSE(make_plan(c, o).hosts->fits_dense);
  EXPECT_EQ(make_plan(c, o).hosts->resident_expert_share, 0);
}

TEST(PlanHosts, RejectsBadNetworksAndSplits) {
  test::expect_error([] { parse_network("12.5", "--network"); }, "--network 12.5: give GBPS,LATENCY_US");
  test::expect_error([] { parse_network("x,5", "--network"); }, "--network x,5: give GBPS,LATENCY_US");
  test::expect_error([] { parse_network("0,5", "--network"); }, "the bandwidth must be > 0");
  test::expect_error([] { parse_network("10,-1", "--network"); }, "give GBPS,LATENCY_US");
  PlanOptions o;
  HostsOptions h;
  h.network = parse_network("10,5", "--network");
  h.memory_bytes = 1e9;
  h.bandwidth_bytes_per_s = 1e9;
  h.hosts = 3;
  o.hosts = h;
  test::expect_error([&] { make_plan(load("configs/small.json"), o); }, "the 128 routed experts of a layer must split evenly");
}

TEST(Plan, ParsesGpusAndFormats) {
  const GpuSpec h100 = parse_gpu("h100-80g");
  EXPECT_DOUBLE_EQ(h100.memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(h100.bandwidth_bytes_per_s, 3.35e12);
  const GpuSpec custom = parse_gpu("custom:96,4.5,700");
  EXPECT_DOUBLE_EQ(custom.memory_bytes, 96e9);
  EXPECT_DOUBLE_EQ(custom.bandwidth_bytes_per_s, 4.5e12);
  EXPECT_DOUBLE_EQ(custom.bf16_flops, 700e12);
  EXPECT_THROW(parse_gpu("x100"), Error);
  for (const char* bad : {"custom:", "custom:96,4.5", "custom:96,4.5,700,1", "custom:96,-1,700", "custom:a,b,c"})
    EXPECT_THROW(parse_gpu(bad), Error) << bad;
  EXPECT_DOUBLE_EQ(parse_weight_format("int4").bytes_per_value, 0.5 + 2.0 / 128);
  EXPECT_DOUBLE_EQ(parse_cache_format("fp8").bytes_per_value, 1.0);
  EXPECT_THROW(parse_weight_format("fp4"), Error);
  EXPECT_THROW(parse_cache_format("int8"), Error);
}

}  // namespace
}  // namespace hyla
