#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hyla/io/file.h"
#include "hyla/plan/units.h"
#include "test_util.h"

namespace hyla {
namespace {

using json = nlohmann::json;
using test::run_hyla;

std::string config_path(const std::string& name) { return (test::source_dir() / "configs" / name).string(); }

TEST(PlanCli, JsonHasTheDocumentedNumbers) {
  const auto r = run_hyla("plan --config " + config_path("flagship-2.8t.json") + " --weights int8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  for (const char* key : {"params_total", "params_active", "weight_bytes", "sequence_state_bytes", "min_gpus",
                          "decode_tokens_per_s_per_gpu_upper_bound"})
    EXPECT_TRUE(j.at(key).is_number()) << key;
  EXPECT_EQ(j["params_total"].get<int64_t>(), 2808304853984);
  // "104 billion activated parameters require about 1040 GB at INT8": the active weights are about
  // 108 GB at INT8, and what must be resident is all 2.8T parameters, about 2.9 TB.
  EXPECT_NEAR(j["active_weight_bytes"].get<double>(), 108e9, 1e9);
  EXPECT_GT(j["weight_bytes"].get<double>(), 2.8e12);
  EXPECT_EQ(j["params_by_component"]["routed_experts"]["total"].get<int64_t>(), 2752335839232);
}

// `hyla plan` reads a released Hugging Face config.json as it is: Kimi K3's gives the totals of
// configs/kimi-k3.json (docs/plan.md).
TEST(PlanCli, ReadsAnHfConfigJson) {
  const auto hf = run_hyla("plan --config " + (test::source_dir() / "tests/data/kimi-k3-hf-config.json").string() +
                           " --json");
  ASSERT_EQ(hf.exit_code, 0) << hf.output;
  const auto ours = run_hyla("plan --config " + config_path("kimi-k3.json") + " --json");
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  EXPECT_EQ(json::parse(hf.output)["params_total"].get<int64_t>(), 2779931834976);
  EXPECT_EQ(json::parse(hf.output)["params_total"], json::parse(ours.output)["params_total"]);
  EXPECT_EQ(json::parse(hf.output)["params_active"], json::parse(ours.output)["params_active"]);
}

// The communication section appears with any of its options, and only then.
TEST(PlanCli, CommunicationOnRequest) {
  const std::string small = "plan --config " + config_path("small.json");
  const auto plain = run_hyla(small + " --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_FALSE(json::parse(plain.output).contains("communication"));
  const auto r = run_hyla(small + " --dp 2 --ep 4 --fabric custom:25,5 --batch-tokens 65536 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json c = json::parse(r.output).at("communication");
  EXPECT_EQ(c["gpus"].get<int64_t>(), 8);
  EXPECT_DOUBLE_EQ(c["scale_out"]["bandwidth_bytes_per_s"].get<double>(), 25e9);
  EXPECT_DOUBLE_EQ(c["scale_out"]["latency_seconds"].get<double>(), 5e-6);
  EXPECT_EQ(c["nvlink"]["name"], "nvlink4");
  EXPECT_DOUBLE_EQ(c["tokens_per_gpu"].get<double>(), 8192);
  // 8 GPUs in one NVLink domain of 8: the all-to-all never leaves it.
  EXPECT_EQ(c["all_to_all_per_gpu_per_step"]["scale_out_bytes"].get<double>(), 0);
  EXPECT_EQ(c["needed_bandwidth_link"], "nvlink");
  for (const char* key : {"all_to_all_bytes_per_token_per_moe_layer", "gradient_bytes_per_gpu_per_step",
                          "compute_seconds_per_step", "comm_seconds_per_step", "comm_share_no_overlap",
                          "step_seconds_full_overlap", "needed_bandwidth_bytes_per_s"})
    EXPECT_TRUE(c.at(key).is_number()) << key;
  const auto text = run_hyla(small + " --fabric roce-400");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("communication (training on DP 1 x EP 1 = 1 GPU; TP = PP = 1)"), std::string::npos)
      << text.output;
}

// Every "$ hyla plan ..." block in docs/plan.md is exactly what the command prints today.
TEST(PlanCli, DocsShowWhatTheCommandPrints) {
  const std::string doc = read_file((test::source_dir() / "docs/plan.md").string());
  const std::string opening = "```text\n$ hyla ", closing = "```";
  int blocks = 0;
  for (size_t at = doc.find(opening); at != std::string::npos; at = doc.find(opening, at), ++blocks) {
    const size_t args_begin = at + opening.size(), args_end = doc.find('\n', args_begin);
    const size_t end = doc.find(closing, args_end);
    ASSERT_NE(end, std::string::npos) << "unclosed block in docs/plan.md";
    const std::string command = doc.substr(args_begin, args_end - args_begin);
    const std::string expected = doc.substr(args_end + 1, end - args_end - 1);
    // The docs name the config relative to the repository; the test runs from the build directory.
    std::string args = command;
    const std::string relative = "--config configs/";
    if (const size_t p = args.find(relative); p != std::string::npos)
      args.replace(p, relative.size(), "--config " + config_path(""));
    const auto r = run_hyla(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, expected) << "docs/plan.md is stale for `hyla " << command << "`; it now prints:\n" << r.output;
    at = end + closing.size();
  }
  EXPECT_GE(blocks, 2);
}

// Each row of the flagship's communication table in docs/plan.md is what `hyla plan --json` gives
// for the row's layout, formatted as the command beside the table formats it.
TEST(PlanCli, DocsCommunicationTableIsCurrent) {
  const std::string doc = read_file((test::source_dir() / "docs/plan.md").string());
  const size_t header = doc.find("| GPUs | DP x EP |");
  ASSERT_NE(header, std::string::npos) << "no communication table in docs/plan.md";
  size_t at = doc.find('\n', doc.find('\n', header) + 1) + 1;  // past the header and the rule
  int rows = 0;
  for (; at < doc.size() && doc[at] == '|'; ++rows) {
    const size_t end = doc.find('\n', at);
    const std::string row = doc.substr(at, end - at);
    at = end + 1;
    long long dp = 0, ep = 0;
    const size_t layout = row.find('|', 1) + 1;
    ASSERT_EQ(std::sscanf(row.c_str() + layout, " %lld x %lld", &dp, &ep), 2) << row;
    const auto r =
        run_hyla(fmt::format("plan --config {} --dp {} --ep {} --json", config_path("flagship-2.8t.json"), dp, ep));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json c = json::parse(r.output).at("communication");
    const std::string expected = fmt::format(
        "| {} | {} x {} | {:.2f} | {:.2f} | {:.1f} | {:.1f} | {:.1f}% | {:.1f} | {} | {:.0f}{} | {:.0f} |",
        grouped(c["gpus"].get<int64_t>()), dp, ep, c["all_to_all_per_gpu_per_step"]["bytes"].get<double>() / 1e12,
        c["gradient_bytes_per_gpu_per_step"].get<double>() / 1e12, c["compute_seconds_per_step"].get<double>(),
        c["comm_seconds_per_step"].get<double>(), 100 * c["comm_share_no_overlap"].get<double>(),
        c["step_seconds_full_overlap"].get<double>(), c["bound"].get<std::string>(),
        c["needed_bandwidth_bytes_per_s"].get<double>() / 1e9,
        c["needed_bandwidth_link"] == "nvlink" ? " (NVLink)" : "",
        c["state_bytes_per_gpu_zero1"].get<double>() / 1e9);
    EXPECT_EQ(row, expected) << "docs/plan.md's communication table is stale";
  }
  EXPECT_EQ(rows, 15);
}

TEST(PlanCli, HostsOnRequest) {
  const std::string k3 = "plan --config " + config_path("kimi-k3.json") + " --context 8192 --weights q8_0";
  const auto r = run_hyla(k3 + " --hosts 4 --network 12.5,5 --host-memory 768 --host-bandwidth 400 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json h = json::parse(r.output).at("hosts");
  EXPECT_EQ(h["hosts"], 4);
  EXPECT_EQ(h["one_host"]["hosts"], 1);
  EXPECT_EQ(h["options"]["expert_weights"], "mxfp4");
  EXPECT_GT(h["decode_tokens_per_s_per_sequence"].get<double>(), h["one_host"]["decode_tokens_per_s_per_sequence"].get<double>());
  const auto text = run_hyla(k3 + " --hosts 4 --network 12.5,5 --host-memory 768 --host-bandwidth 400");
  EXPECT_NE(text.output.find("across 4 hosts"), std::string::npos) << text.output;
  const auto missing = run_hyla(k3 + " --hosts 4 --host-memory 768 --host-bandwidth 400");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--hosts needs --network GBPS,LATENCY_US, --host-memory GB and --host-bandwidth GB/s"),
            std::string::npos) << missing.output;
  const auto format = run_hyla(k3 + " --hosts 2 --network 1,1 --host-memory 8 --host-bandwidth 8 --expert-weights nf4");
  EXPECT_NE(format.output.find("--expert-weights: unknown format 'nf4'"), std::string::npos) << format.output;
}

TEST(PlanCli, BadOptionsGiveOneLineErrors) {
  const std::string small = "plan --config " + config_path("small.json");
  const std::pair<std::string, std::string> cases[] = {
      {" --gpu x100", "--gpu: unknown GPU 'x100'"},
      {" --gpu custom:80,3", "--gpu custom:80,3: expected custom:MEM_GB,BW_TBps,TFLOPS"},
      {" --gpu custom:80,zero,900", "'zero' is not a positive number"},
      {" --batch 0", "--batch 0: must be at least 1"},
      {" --batch -2", "--batch -2: must be at least 1"},
      {" --batch two", "--batch = two"},
      {" --context 2000000", "--context 2000000: must lie in [1, max_position_embeddings = 1048576]"},
      {" --weights fp4", "--weights: unknown format 'fp4' (known: bf16, fp8, int8, int4, q8_0, mxfp4)"},
      {" --kv int4", "--kv: unknown format 'int4' (known: bf16, fp8)"},
      {" --mfu 0", "--mfu 0: must lie in (0, 1]"},
      {" --ep 3", "--ep 3: must divide the 128 routed experts"},
      {" --dp 0", "--dp 0: must be at least 1"},
      {" --dp 2 --fabric ib-xdr", "--fabric: unknown fabric 'ib-xdr' (known: nvlink4, nvlink5, ib-ndr400"},
      {" --nvlink custom:fast", "--nvlink custom:fast: 'fast' is not a number >= 0"},
      {" --ep 4 --comm-target 1.5", "--comm-target 1.5: must lie in (0, 1)"},
      {" --comm-target 0", "--comm-target 0: must lie in (0, 1)"},
      {" --ep 4 --nvlink-domain 0", "--nvlink-domain 0: must be at least 1"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_hyla(small + args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  const auto r = run_hyla("plan --config " + config_path("missing.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

}  // namespace
}  // namespace hyla
