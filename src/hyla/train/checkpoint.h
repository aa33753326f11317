#pragma once
// Checkpoints of a training run: RUN_DIR/checkpoints/step-00001234/ holding the model directory
// (config.json, f32 model.safetensors, tokenizer.json), the optimiser state (one file, or one
// part per process under ZeRO-1 or expert parallelism, each written by its process in parallel)
// and trainer.json (step,
// loader state, counters, the optimiser files). Each is built beside its final name and renamed
// into place by rank 0 once every process has written its part; trainer.json is written last and
// marks the checkpoint complete. Only the newest `keep` are kept.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hyla/model/collective.h"
#include "hyla/model/model.h"
#include "hyla/train/optimizer.h"

namespace hyla {

struct CheckpointInfo {
  std::filesystem::path dir;
  int64_t step = 0;  // optimiser steps completed
};

// How a run's processes hold its state: rank 0 of `world` writes what every process holds alike;
// with expert parallelism (groups of `expert_parallel` consecutive ranks), each process of the
// first group writes its routed experts' weights and moments too.
struct ProcessLayout {
  Collective& world;
  int64_t expert_parallel = 1;
};

// A model directory `dir`, written by the layout's processes together (every process calls it):
// one model.safetensors, or with expert parallelism one part per process of the first group
// (model-0000q-of-0000G.safetensors) and the index naming each tensor's part.
void save_model(const std::filesystem::path& dir, const Model& model, const std::filesystem::path& tokenizer,
                const ProcessLayout& layout);

// Called by every process of the layout together.
void save_checkpoint(const std::filesystem::path& run_dir, int64_t step, const Model& model, const AdamW& optimizer,
                     const nlohmann::json& trainer_state, const std::filesystem::path& tokenizer, int64_t keep,
                     const ProcessLayout& layout = {single_process(), 1});

// Makes a run directory ready for a run (the lead process only): creates it, removes unfinished
// checkpoints, and unless resuming refuses one that holds an earlier run's checkpoints (keep-N
// pruning would delete the new run's lower-numbered ones, and a later --resume would continue
// the old run: never two runs in one directory), or with `overwrite` deletes them.
void prepare_run_directory(const std::filesystem::path& run_dir, bool resume, bool overwrite);

// Continues a run (`hyla train --resume`, `hyla rl --resume`): loads the newest checkpoint's
// weights into `model` (the parameters `holds` accepts; all when empty) and its moments into
// `optimizer`, and on the lead process keeps the rows of metrics.jsonl up to the checkpoint's step
// (a line cut by a kill is dropped). Returns the checkpoint's trainer.json. A run without a
// checkpoint, or whose checkpoint holds another model than `model_source`, is an error.
nlohmann::json resume_run(const std::filesystem::path& run_dir, Model& model, AdamW& optimizer,
                          const std::string& model_source, bool lead,
                          const std::function<bool(const Param&)>& holds = {});

// Loads the weights of model directory `dir` into `model` (the parameters `holds` accepts; all
// when empty) and refreshes the bf16 copies: `hyla train --init`, and resume_run. A directory
// whose config.json differs from the model's is an error naming it and `model_source`, except in
// max_position_embeddings when `extends_context` (--init: no weight depends on the position limit,
// so a run may raise it, as the long-context ladder does from the base model).
void load_weights(Model& model, const std::filesystem::path& dir, const std::string& model_source,
                  const std::function<bool(const Param&)>& holds = {}, bool extends_context = false);

}  // namespace hyla
