#pragma once
// TRAIN.json: optimiser, schedule, precision, the context curriculum, evaluation, checkpoints.
// Parsed strictly like config.json (unknown keys and broken rules are errors naming the key).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hyla/data/image_augment.h"
#include "hyla/model/context.h"
#include "hyla/train/optimizer_config.h"

namespace hyla {

class JsonFields;

// Reads "precision" ("bf16", the default, or "f32") of a config: TRAIN.json and RL.json.
Precision read_precision(JsonFields& fields);

struct CurriculumStage {
  int64_t seq_len = 256;        // tokens per sequence (T)
  int64_t tokens = 1000000;     // training tokens in this stage
  int64_t batch_tokens = 8192;  // tokens per optimiser step (B·T, across gradient accumulation)
  double lr_scale = 1.0;        // multiplies the schedule's learning rate during the stage
  // Rows of synthetic long-context samples per text row in this stage; -1: TRAIN.json's
  // longctx.ratio. A ladder wants many short samples early (retrieval is learnt at the shortest
  // length) and fewer rows late, where each sample is long and attention's cost grows with it.
  double longctx_ratio = -1;
  // The synthetic tasks this stage draws from, a subset of longctx.tasks; empty: all of them. A
  // ladder can teach one retrieval task first and add the others once copying is learnt.
  std::vector<std::string> longctx_tasks;
  // The share of each micro-batch's loss its long-context answers carry in this stage; -1:
  // TRAIN.json's longctx.answer_share.
  double longctx_answer_share = -1;
  int64_t steps() const { return (tokens + batch_tokens - 1) / batch_tokens; }
  int64_t sequences() const { return batch_tokens / seq_len; }
};

struct TrainConfig {
  uint64_t seed = 1;
  Precision precision = Precision::BF16;
  OptimizerConfig optimizer;  // "optimizer" (AdamW), "grad_clip" and "schedule"
  int64_t grad_accum = 1;     // micro-batches per step
  std::vector<CurriculumStage> curriculum{CurriculumStage{}};
  int64_t eval_every = 100, eval_batches = 8;
  int64_t checkpoint_every = 200, keep_checkpoints = 2;
  int64_t log_every = 1;
  int64_t sample_every = 0, sample_tokens = 64;  // 0: no samples
  std::string sample_prompt = "";
  double sample_temperature = 0.8;
  int64_t max_bad_steps = 5;  // consecutive non-finite steps before the run stops
  // Image-text records (`hyla train --images DIR`) join every micro-batch: this many image-sequence
  // rows per text row, added to the text, which stays as the curriculum says (a text-only twin with
  // the same curriculum sees exactly the same text). 0: text only.
  double image_ratio = 0;
  // The share of image records drawn from each `--images` directory, in order (normalised; one
  // weight per directory). Empty: every record equally likely, so a set weighs by its size.
  std::vector<double> image_weights;
  // Augmentation of each `--images` directory's training images, in order (data/image_augment.h:
  // "flip" probability, "shift" pixels; {} for none). Empty: no directory is augmented.
  std::vector<ImageAugment> image_augment;
  // Synthetic long-context sequences (eval/longctx_tasks.h: the suite's generators, drawn from a
  // training seed stream the evaluation never uses) join every micro-batch: this many rows per text
  // row, each sample filling the stage's seq_len, loss on its answer only. Haystacks are cut from
  // `longctx_haystack` (a text file, one sentence a line). 0: none. Every task a stage lists must
  // fit its seq_len (checked when training starts).
  double longctx_ratio = 0;
  std::vector<std::string> longctx_tasks;
  std::string longctx_haystack;
  // A task's chance of being drawn, relative to the others a stage lists (longctx.weights; 1 for a
  // task it does not name).
  std::map<std::string, double> longctx_weights;
  // The share of each micro-batch's loss the long-context answers carry, in (0, 1): their scored
  // tokens are weighted to it and every other scored token to the rest, so the answers weigh the
  // same at 256 tokens as at 32K, where one sample's text row would otherwise outweigh them a
  // hundred times. -1: no weighting (every scored token counts once).
  double longctx_answer_share = -1;
  // Agent demonstrations (agent/agent.h's expert playing the environments' train split, faults
  // injected and recovered from) join every micro-batch: this many rows per text row, in SPEC §8's
  // chat format, loss on the assistant's turns only (the SFT stage of docs/agent.md). 0: none.
  double agent_ratio = 0;
  std::vector<std::string> agent_environments;
  double agent_fault_share = 0.2;
  // Under mpirun (docs/distributed.md): ZeRO stage 0 (every process keeps the whole optimiser
  // state) or 1 (each keeps its shard), expert-parallel groups of this many processes (each holds
  // 1/expert_parallel of every MoE layer's routed experts), and the gradient buckets' size.
  int64_t zero_stage = 0;
  int64_t expert_parallel = 1;
  double bucket_mb = 16;

  static TrainConfig from_json(const nlohmann::json& j, const std::string& source = "train.json");
  static TrainConfig load(const std::string& path);
  nlohmann::json to_json() const;
  void validate(const std::string& source = "train.json") const;
  int64_t total_steps() const;
  // The stage that step `step` (0-based) belongs to, and the first step of each stage.
  int64_t stage_of(int64_t step) const;
  int64_t stage_start(int64_t stage) const;
  // Longctx rows per text row in stage `stage`: the stage's own ratio, else longctx.ratio.
  double longctx_ratio_of(int64_t stage) const;
  // The tasks stage `stage` draws from: its own list, else longctx.tasks.
  const std::vector<std::string>& longctx_tasks_of(int64_t stage) const;
  // The long-context answers' share of the loss in stage `stage`: its own, else longctx.answer_share.
  double longctx_answer_share_of(int64_t stage) const;
  // What train_step reads.
  StepSettings step_settings() const { return {precision, grad_accum, optimizer.grad_clip}; }
};

// The learning rate at step `step` (0-based) of the whole curriculum, times its stage's lr_scale.
double learning_rate(const TrainConfig& config, int64_t step);

}  // namespace hyla
