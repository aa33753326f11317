#pragma once
// The synthetic rows the trainer mixes into every micro-batch beside the text: image-text records
// (`--images`, TRAIN.json's "images"), long-context samples ("longctx") and agent demonstrations
// ("agent"). The text stays as the curriculum says; each source adds rows in proportion to it.
//
// What crosses this seam: the curriculum stage and the micro-batch's text rows go in; packed
// sequences appended to the micro-batch's ModelInput come out (targets -1 where there is no loss).
// Each source's draw state goes into the checkpoint under its name, so a resumed run draws exactly
// the rows the uninterrupted one would have.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/data/tokenizer.h"
#include "hyla/model/config.h"
#include "hyla/model/model.h"
#include "hyla/train/train_config.h"

namespace hyla {

class RowSource {
 public:
  virtual ~RowSource() = default;
  // Its state's key in trainer.json.
  virtual const char* name() const = 0;
  // The rows it adds to a micro-batch of `text_rows` text rows at curriculum stage `stage` (0: none).
  virtual int64_t rows(int64_t stage, double text_rows) const = 0;
  // Appends at least `rows` rows to `in`.
  virtual void append(ModelInput& in, int64_t stage, int64_t rows) = 0;
  // Whether its rows run at the stage's sequence length (they then count in the run's FLOPs
  // estimate); rows of their own, shorter lengths do not.
  virtual bool runs_at_stage_length() const { return false; }
  // The share of the micro-batch's loss this source's scored rows carry at `stage`, in (0, 1), or
  // -1: each of its scored rows counts as one, as a text row does.
  virtual double loss_share(int64_t /*stage*/) const { return -1; }
  // What the stage announcement adds about this source (", ..."), or nothing.
  virtual std::string stage_note(int64_t /*stage*/) const { return {}; }
  virtual nlohmann::json state() const = 0;
  virtual void set_state(const nlohmann::json& state) = 0;
};

// Rows [first, end) of a micro-batch and the share of its loss they carry (RowSource::loss_share).
struct LossShare {
  int64_t first = 0, end = 0;
  double share = -1;
};

// Sets `in.loss_weights` so that the scored rows of each range with a share carry that share of
// the micro-batch's loss and the other scored rows the rest, the weights summing to the number of
// scored rows (a mean stays a mean). A range without scored rows carries nothing, and its share
// goes to the rest; where nothing else is scored, the shares are scaled to sum to 1. Ranges
// whose share is -1 are left as they are. The shares must sum to less than 1.
void apply_loss_shares(ModelInput& in, const std::vector<LossShare>& shares);

// The sources `config` asks for, in the order their rows join a micro-batch (images, long
// context, agent demonstrations), each announced on stdout. `images_dirs` are `--images`; the
// config and the tokenizer must outlive the sources.
std::vector<std::unique_ptr<RowSource>> make_row_sources(const TrainConfig& config,
                                                         const std::vector<std::string>& images_dirs,
                                                         const Tokenizer& tokenizer, const VisionConfig& vision);

}  // namespace hyla
