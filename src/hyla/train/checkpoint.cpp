#include "hyla/train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"

namespace hyla {
namespace fs = std::filesystem;

namespace {

std::vector<CheckpointInfo> checkpoints(const fs::path& run_dir) {
  std::vector<CheckpointInfo> list;
  const fs::path root = run_dir / "checkpoints";
  if (!fs::exists(root)) return list;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (name.rfind("step-", 0) != 0 || name.find(".tmp-") != std::string::npos) continue;
    if (std::sscanf(name.c_str(), "step-%ld", &step) != 1) continue;
    if (!fs::exists(entry.path() / "trainer.json")) continue;  // written last: the checkpoint is complete
    list.push_back({entry.path(), step});
  }
  std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return list;
}

}  // namespace

void save_checkpoint(const fs::path& run_dir, int64_t step, const Model& model, const AdamW& optimizer,
                     const nlohmann::json& trainer_state, const fs::path& tokenizer, int64_t keep, Collective& collective) {
  const fs::path root = run_dir / "checkpoints";
  const bool lead = collective.rank() == 0;
  const bool sharded = optimizer.shard().count != model.params().numel();
  std::unique_ptr<AtomicDirectory> out;
  std::string temp;
  if (lead) {
    fs::create_directories(root);
    out = std::make_unique<AtomicDirectory>(root / fmt::format("step-{:08d}", step));
    temp = out->temp().string();
  }
  collective.broadcast(temp);
  auto shard_name = [&](int rank) {
    return sharded ? fmt::format("optimizer-{:05d}-of-{:05d}.safetensors", rank, collective.size())
                   : std::string("optimizer.safetensors");
  };
  if (sharded || lead) optimizer.save(fs::path(temp) / shard_name(collective.rank()));
  collective.barrier();  // every shard is on disk
  if (!lead) return;
  model.save(out->temp() / "model", DType::F32, tokenizer);
  nlohmann::json state = trainer_state;
  state["optimizer"] = nlohmann::json::array();
  for (int r = 0; r < (sharded ? collective.size() : 1); ++r) state["optimizer"].push_back(shard_name(r));
  write_file_atomic(out->temp() / "trainer.json", state.dump(2) + "\n");
  out->commit();
  auto all = checkpoints(run_dir);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i].dir);
}

void remove_unfinished_checkpoints(const fs::path& run_dir) {
  const fs::path root = run_dir / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos))
      fs::remove_all(entry.path(), ec);
  }
}

void remove_checkpoints(const fs::path& run_dir) { fs::remove_all(run_dir / "checkpoints"); }

std::optional<CheckpointInfo> latest_checkpoint(const fs::path& run_dir) {
  auto all = checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

nlohmann::json load_trainer_state(const CheckpointInfo& checkpoint) {
  return parse_json_file((checkpoint.dir / "trainer.json").string());
}

std::vector<fs::path> optimizer_files(const CheckpointInfo& checkpoint) {
  const nlohmann::json state = load_trainer_state(checkpoint);
  const fs::path trainer = checkpoint.dir / "trainer.json";
  HYLA_CHECK(state.contains("optimizer") && state["optimizer"].is_array() && !state["optimizer"].empty(),
             "{}: no \"optimizer\" list of files", trainer.string());
  std::vector<fs::path> files;
  for (const auto& name : state["optimizer"]) {
    HYLA_CHECK(name.is_string(), "{}: \"optimizer\" must list file names", trainer.string());
    files.push_back(checkpoint.dir / name.get<std::string>());
    HYLA_CHECK(fs::exists(files.back()), "{}: lists {}, which is missing", trainer.string(), files.back().string());
  }
  return files;
}

}  // namespace hyla
