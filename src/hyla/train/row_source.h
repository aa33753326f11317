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
  // What the stage announcement adds about this source (", ..."), or nothing.
  virtual std::string stage_note(int64_t /*stage*/) const { return {}; }
  virtual nlohmann::json state() const = 0;
  virtual void set_state(const nlohmann::json& state) = 0;
};

// The sources `config` asks for, in the order their rows join a micro-batch (images, long
// context, agent demonstrations), each announced on stdout. `images_dirs` are `--images`; the
// config and the tokenizer must outlive the sources.
std::vector<std::unique_ptr<RowSource>> make_row_sources(const TrainConfig& config,
                                                         const std::vector<std::string>& images_dirs,
                                                         const Tokenizer& tokenizer, const VisionConfig& vision);

}  // namespace hyla
