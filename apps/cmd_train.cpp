#include "commands.h"
#include "hyla/train/trainer.h"

namespace hyla::cli {

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model on a prepared token dataset (hyla data prepare)");
  static TrainOptions o;
  cmd->add_option("--config", o.model_config, "Model config.json")->required()->check(CLI::ExistingFile);
  cmd->add_option("--train", o.train_config, "Training config (TRAIN.json, docs/training.md)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--data", o.data_dir, "Prepared data directory")->required();
  cmd->add_option("--images", o.images_dirs,
                  "Image-text records (hyla data prepare-images/prepare-documents) mixed in by TRAIN.json's images.ratio "
                  "(repeatable: every record of every directory equally likely)");
  cmd->add_option("--out", o.run_dir, "Run directory (metrics, checkpoints, final model)")->required();
  cmd->add_option("--steps", o.steps, "Total optimiser steps (the curriculum is scaled to fit)")->check(positive());
  cmd->add_option("--batch", o.batch, "Sequences per step in every stage")->check(positive());
  cmd->add_option("--seq", o.seq, "A single stage of this sequence length")->check(positive());
  cmd->add_option("--lr", o.lr, "Peak learning rate")->check(positive());
  auto* resume = cmd->add_flag("--resume", o.resume, "Continue from the run directory's newest checkpoint");
  cmd->add_option("--init", o.init_dir,
                  "Start from this model directory's weights (its config must equal --config): fine-tuning, e.g. the SFT "
                  "stage of docs/agent.md; a GGUF file too)")
      ->check(CLI::ExistingPath)
      ->excludes(resume);
  cmd->add_flag("--overwrite", o.overwrite, "Start a new run in a run directory that holds checkpoints (deleting them)")
      ->excludes(resume);
  cmd->add_flag("--deterministic", o.deterministic, "One thread: losses reproduce bit for bit, across a resume too");
  cmd->add_flag("--quiet", o.quiet, "No per-step lines (evaluations, samples and stages still print)");
  cmd->callback([] { run_training(o); });
}

}  // namespace hyla::cli
