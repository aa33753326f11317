#include "hyla/train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
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
                     const nlohmann::json& trainer_state, const fs::path& tokenizer, int64_t keep) {
  const fs::path root = run_dir / "checkpoints";
  fs::create_directories(root);
  AtomicDirectory out(root / fmt::format("step-{:08d}", step));
  model.save(out.temp() / "model", DType::F32, tokenizer);
  optimizer.save(out.temp() / "optimizer.safetensors");
  write_file_atomic(out.temp() / "trainer.json", trainer_state.dump(2) + "\n");
  out.commit();
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

}  // namespace hyla
