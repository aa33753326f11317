#include <gtest/gtest.h>

#include <fstream>

#include "hyla/data/tokenizer.h"
#include "hyla/io/safetensors.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using test::run_hyla;

TEST(Cli, HelpListsSubcommands) {
  const auto r = run_hyla("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"version", "inspect", "init", "tokenizer", "data"}) EXPECT_NE(r.output.find(cmd), std::string::npos) << cmd;
  EXPECT_EQ(run_hyla("inspect --help").exit_code, 0);
  EXPECT_NE(run_hyla("no-such-command").exit_code, 0);
}

TEST(Cli, InitThenInspectRoundTrips) {
  test::TempDir dir;
  const std::string config = (test::source_dir() / "configs/nano.json").string();
  const auto out = (dir / "nano").string();
  auto r = run_hyla("init --config " + config + " --out " + out + " --seed 3 --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_hyla("inspect " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.layers.1.self_attn.kv_b_proj.weight"), std::string::npos);
  EXPECT_NE(r.output.find("ok: weights match config.json"), std::string::npos);
  EXPECT_NE(r.output.find("BF16"), std::string::npos);

  // The same seed writes the same weights; another seed does not.
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + out + "2 --seed 3 --dtype bf16").exit_code, 0);
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + out + "3 --seed 4 --dtype bf16").exit_code, 0);
  const std::string a = read_file(out + "/model.safetensors"), b = read_file(out + "2/model.safetensors"),
                    c = read_file(out + "3/model.safetensors");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // A tokenizer given to init lands as tokenizer.json, whatever its file was called.
  test::small_tokenizer().save(dir / "my-tok.json");
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + out + "4 --tokenizer " + (dir / "my-tok.json").string()).exit_code, 0);
  EXPECT_EQ(Tokenizer::load(out + "4/tokenizer.json").vocab_size(), test::small_tokenizer().vocab_size());
}

TEST(Cli, InspectFailsWithOneLineErrors) {
  test::TempDir dir;
  const auto out = (dir / "m").string();
  ASSERT_EQ(run_hyla("init --config " + (test::source_dir() / "configs/nano.json").string() + " --out " + out).exit_code, 0);
  // Truncate the weights: one line, naming the file.
  std::string bytes = read_file(out + "/model.safetensors");
  test::write_bytes(out + "/model.safetensors", bytes.substr(0, bytes.size() - 10));
  auto r = run_hyla("inspect " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.safetensors: truncated"), std::string::npos) << r.output;
  // A config that does not match the weights.
  test::write_bytes(out + "/model.safetensors", bytes);
  std::string config = read_file(out + "/config.json");
  config.replace(config.find("\"hidden_size\": 64"), 17, "\"hidden_size\": 32");
  test::write_bytes(out + "/config.json", config);
  r = run_hyla("inspect " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("but config.json needs"), std::string::npos) << r.output;
  r = run_hyla("inspect " + (dir / "missing").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("cannot open"), std::string::npos) << r.output;
}

TEST(Cli, BadThreadCountIsAnError) {
  const auto r = run_hyla("--threads 0 version");
  EXPECT_EQ(r.exit_code, 0);  // 0 = default
  EXPECT_NE(run_hyla("--threads abc version").exit_code, 0);
}

}  // namespace
}  // namespace hyla
