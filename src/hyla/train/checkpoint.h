#pragma once
// Checkpoints of a training run: RUN_DIR/checkpoints/step-00001234/ holding the model directory
// (config.json, f32 model.safetensors, tokenizer.json), the optimiser state and trainer.json (step,
// loader state, counters). Each is built beside its final name and renamed into place, and only
// the newest `keep` are kept.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "hyla/model/model.h"
#include "hyla/train/optimizer.h"

namespace hyla {

struct CheckpointInfo {
  std::filesystem::path dir;
  int64_t step = 0;  // optimiser steps completed
};

void save_checkpoint(const std::filesystem::path& run_dir, int64_t step, const Model& model, const AdamW& optimizer,
                     const nlohmann::json& trainer_state, const std::filesystem::path& tokenizer, int64_t keep);

// Removes what interrupted saves left in RUN_DIR/checkpoints (half-built step-N.tmp-* and step-N.old-*
// directories, which can be gigabytes each).
void remove_unfinished_checkpoints(const std::filesystem::path& run_dir);

// Deletes every checkpoint of a run (a new run replacing an old one).
void remove_checkpoints(const std::filesystem::path& run_dir);

// The newest complete checkpoint of a run, if any.
std::optional<CheckpointInfo> latest_checkpoint(const std::filesystem::path& run_dir);

nlohmann::json load_trainer_state(const CheckpointInfo& checkpoint);

}  // namespace hyla
