#include "hyla/train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/dist/expert_parallel.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/expert_exchange.h"

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

std::string part_name(const char* kind, int64_t part, int64_t parts) {
  return parts == 1 ? fmt::format("{}.safetensors", kind) : fmt::format("{}-{:05d}-of-{:05d}.safetensors", kind, part + 1, parts);
}

// Rank 0 makes the directory; every process learns its temporary path.
std::string shared_temp(std::unique_ptr<AtomicDirectory>& out, const fs::path& dir, Collective& world) {
  std::string temp;
  if (world.rank() == 0) {
    out = std::make_unique<AtomicDirectory>(dir);
    temp = out->temp().string();
  }
  world.broadcast(temp);
  return temp;
}

// Writes into `temp` (shared by every process) this process's part of the model directory.
void write_model_part(const fs::path& temp, const Model& model, const fs::path& tokenizer, const ProcessLayout& layout) {
  const int64_t G = layout.expert_parallel, rank = layout.world.rank();
  if (G == 1) {
    if (rank == 0) save_model_weights(temp, model.params().named_values(DType::F32));
  } else if (rank < G) {
    NamedTensors mine;
    for (auto& [name, tensor] : model.params().named_values(DType::F32))
      if (rank == 0 || routed_expert_of(name) >= 0) mine.emplace_back(name, tensor);
    save_safetensors(temp / part_name("model", rank, G), mine);
  }
  if (rank != 0) return;
  write_file_atomic(temp / "config.json", model.config().to_json().dump(2) + "\n");
  if (!tokenizer.empty()) {
    std::error_code ec;
    fs::copy_file(tokenizer, temp / "tokenizer.json", ec);
    HYLA_CHECK(!ec, "{}: cannot copy into the model directory: {}", tokenizer.string(), ec.message());
  }
  if (G == 1) return;
  const int64_t E = model.config().moe.num_experts;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& p : model.params().params()) {
    const int64_t e = routed_expert_of(p->name);
    weight_map[p->name] = part_name("model", e >= 0 ? expert_holder(E, e, int(G)) : 0, G);
  }
  write_file_atomic(temp / "model.safetensors.index.json",
                    nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump(2) + "\n");
}

// What interrupted saves left in RUN_DIR/checkpoints: half-built step-N.tmp-* and step-N.old-*
// directories, which can be gigabytes each.
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

// The newest complete checkpoint of a run, if any.
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

// A resumed run's metrics.jsonl keeps the rows up to its checkpoint's step (a killed run wrote more).
void truncate_metrics(const std::filesystem::path& file, int64_t step) {
  if (!std::filesystem::exists(file)) return;
  std::ifstream in(file);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t(0)) <= step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // a line cut by the kill: dropped
    }
  }
  write_file_atomic(file, kept);
}

}  // namespace

void save_model(const fs::path& dir, const Model& model, const fs::path& tokenizer, const ProcessLayout& layout) {
  std::unique_ptr<AtomicDirectory> out;
  const std::string temp = shared_temp(out, dir, layout.world);
  write_model_part(temp, model, tokenizer, layout);
  layout.world.barrier();  // every part is on disk
  if (out) out->commit();
}

void save_checkpoint(const fs::path& run_dir, int64_t step, const Model& model, const AdamW& optimizer,
                     const nlohmann::json& trainer_state, const fs::path& tokenizer, int64_t keep,
                     const ProcessLayout& layout) {
  Collective& world = layout.world;
  const int64_t G = layout.expert_parallel, rank = world.rank();
  const fs::path root = run_dir / "checkpoints";
  if (rank == 0) fs::create_directories(root);
  std::unique_ptr<AtomicDirectory> out;
  const fs::path temp = shared_temp(out, root / fmt::format("step-{:08d}", step), world);
  // Who writes which moments: every process its ZeRO-1 shard; else rank 0 what all hold alike
  // and, with expert parallelism, each process of the first group its experts'.
  const bool sharded = optimizer.shard().count != model.params().numel();
  const int64_t writers = sharded ? world.size() : G;
  if (rank < writers)
    optimizer.save(temp / part_name("optimizer", rank, writers),
                   [&](const Param& p) { return sharded || rank == 0 || routed_expert_of(p.name) >= 0; });
  fs::path model_temp = temp / "model";
  if (rank == 0) fs::create_directories(model_temp);
  world.barrier();
  write_model_part(model_temp, model, tokenizer, layout);
  world.barrier();  // every shard and part is on disk
  if (rank != 0) return;
  nlohmann::json state = trainer_state;
  state["optimizer"] = nlohmann::json::array();
  for (int64_t r = 0; r < writers; ++r) state["optimizer"].push_back(part_name("optimizer", r, writers));
  write_file_atomic(temp / "trainer.json", state.dump(2) + "\n");
  out->commit();
  auto all = checkpoints(run_dir);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i].dir);
}

void prepare_run_directory(const std::filesystem::path& run_dir, bool resume, bool overwrite) {
  std::filesystem::create_directories(run_dir);
  remove_unfinished_checkpoints(run_dir);
  if (resume) return;
  if (const auto earlier = latest_checkpoint(run_dir)) {
    HYLA_CHECK(overwrite,
               "{}: holds checkpoints of an earlier run (newest: step {}); pass --resume to continue it, or "
               "--overwrite to start over and delete them",
               run_dir.string(), earlier->step);
    remove_checkpoints(run_dir);
  }
}

nlohmann::json resume_run(const fs::path& run_dir, Model& model, AdamW& optimizer, const std::string& model_source,
                          bool lead, const std::function<bool(const Param&)>& holds) {
  const auto checkpoint = latest_checkpoint(run_dir);
  HYLA_CHECK(checkpoint.has_value(), "{}: --resume but no checkpoint", run_dir.string());
  load_weights(model, checkpoint->dir / "model", model_source, holds);
  optimizer.load(optimizer_files(*checkpoint));
  nlohmann::json state = load_trainer_state(*checkpoint);
  if (lead) {
    truncate_metrics(run_dir / "metrics.jsonl", state.at("step").get<int64_t>());
    fmt::print("resumed from {} (step {})\n", checkpoint->dir.string(), state.at("step").get<int64_t>());
  }
  return state;
}

void load_weights(Model& model, const fs::path& dir, const std::string& model_source,
                  const std::function<bool(const Param&)>& holds, bool extends_context) {
  const std::unique_ptr<Model> saved = Model::load(dir, {.holds = holds});
  ModelConfig saved_config = saved->config();
  if (extends_context) saved_config.max_position_embeddings = model.config().max_position_embeddings;
  HYLA_CHECK(saved_config.to_json() == model.config().to_json(), "{}: its config.json differs from {}{}", dir.string(),
             model_source, extends_context ? " (beyond max_position_embeddings)" : "");
  HYLA_ASSERT(model.params().numel() == saved->params().numel());
  std::memcpy(model.params().values(), saved->params().values(), size_t(model.params().numel()) * 4);
  model.params().refresh_bf16();
}

}  // namespace hyla
