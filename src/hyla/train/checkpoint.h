#pragma once
// Checkpoints of a training run: RUN_DIR/checkpoints/step-00001234/ holding the model directory
// (config.json, f32 model.safetensors, tokenizer.json), the optimiser state (one file, or one
// shard per process under ZeRO-1, each written by its process in parallel) and trainer.json (step,
// loader state, counters, the optimiser files). Each is built beside its final name and renamed
// into place by rank 0 once every process has written its part; trainer.json is written last and
// marks the checkpoint complete. Only the newest `keep` are kept.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "hyla/model/collective.h"
#include "hyla/model/model.h"
#include "hyla/train/optimizer.h"

namespace hyla {

struct CheckpointInfo {
  std::filesystem::path dir;
  int64_t step = 0;  // optimiser steps completed
};

// Called by every process of `collective` together; the model and trainer state are rank 0's.
void save_checkpoint(const std::filesystem::path& run_dir, int64_t step, const Model& model, const AdamW& optimizer,
                     const nlohmann::json& trainer_state, const std::filesystem::path& tokenizer, int64_t keep,
                     Collective& collective = single_process());

// Removes what interrupted saves left in RUN_DIR/checkpoints (half-built step-N.tmp-* and step-N.old-*
// directories, which can be gigabytes each).
void remove_unfinished_checkpoints(const std::filesystem::path& run_dir);

// Deletes every checkpoint of a run (a new run replacing an old one).
void remove_checkpoints(const std::filesystem::path& run_dir);

// The newest complete checkpoint of a run, if any.
std::optional<CheckpointInfo> latest_checkpoint(const std::filesystem::path& run_dir);

nlohmann::json load_trainer_state(const CheckpointInfo& checkpoint);
// The checkpoint's optimiser files (shards), for AdamW::load.
std::vector<std::filesystem::path> optimizer_files(const CheckpointInfo& checkpoint);

}  // namespace hyla
