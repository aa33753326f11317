#pragma once
// A tiny dataset, model and TRAIN.json for end-to-end `hyla train` tests (prepared once per test
// binary): 12 steps of 256 tokens over two curriculum stages (8 sequences of 32, then 4 of 64),
// evaluation every 4 steps, checkpoints every 3 (keep 2).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/io/json_fields.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla::test {

struct TinyRun {
  using json = nlohmann::json;
  TempDir dir;
  std::string data, config, train;
  TinyRun() {
    write_bytes(dir / "text.txt", sample_text(80, 3));
    small_tokenizer().save(dir / "tok.json");
    data = (dir / "data").string();
    EXPECT_EQ(run_hyla("data prepare --tokenizer " + (dir / "tok.json").string() + " --input " +
                       (dir / "text.txt").string() + " --out " + data + " --val-fraction 0.1").exit_code, 0);
    json c = parse_json_file((source_dir() / "configs/nano.json").string());
    c["vocab_size"] = 512;
    write_bytes(dir / "model.json", c.dump());
    config = (dir / "model.json").string();
    const json t = {{"optimizer", {{"lr", 0.003}}},
                    {"schedule", {{"warmup_steps", 3}}},
                    {"curriculum", json::array({{{"seq_len", 32}, {"tokens", 6 * 256}, {"batch_tokens", 256}},
                                                {{"seq_len", 64}, {"tokens", 6 * 256}, {"batch_tokens", 256}}})},
                    {"eval", {{"every", 4}, {"batches", 2}}},
                    {"checkpoint", {{"every", 3}, {"keep", 2}}}};
    write_bytes(dir / "train.json", t.dump());
    train = (dir / "train.json").string();
  }
  std::string args(const std::string& out) const {
    return "train --config " + config + " --train " + train + " --data " + data + " --out " + out;
  }
};

inline TinyRun& tiny() {
  static TinyRun run;
  return run;
}

// Copies run `whole` (trained with two checkpoints kept) to `resumed`, cuts the copy back to its
// earlier checkpoint and resumes it with `args` + resumed + " --resume": what an interrupted run does.
inline CommandResult resume_copy_from_earlier_checkpoint(const std::string& args, const std::string& whole,
                                                         const std::string& resumed) {
  std::filesystem::copy(whole, resumed, std::filesystem::copy_options::recursive);
  std::vector<std::filesystem::path> checkpoints;
  for (const auto& e : std::filesystem::directory_iterator(resumed + "/checkpoints")) checkpoints.push_back(e.path());
  std::sort(checkpoints.begin(), checkpoints.end());
  EXPECT_EQ(checkpoints.size(), 2u);
  std::filesystem::remove_all(checkpoints.back());
  std::filesystem::remove_all(resumed + "/model");
  return run_hyla(args + resumed + " --resume");
}

// The rows of a run's metrics.jsonl.
inline std::vector<nlohmann::json> metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

}  // namespace hyla::test
