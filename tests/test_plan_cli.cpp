#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hyla/io/file.h"
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
      {" --weights fp4", "--weights: unknown format 'fp4' (known: bf16, fp8, int8, int4)"},
      {" --kv int4", "--kv: unknown format 'int4' (known: bf16, fp8)"},
      {" --mfu 0", "--mfu 0: must lie in (0, 1]"},
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
