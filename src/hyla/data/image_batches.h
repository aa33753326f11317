#pragma once
// Image-text training and evaluation sequences from image records (data/image_records.h), laid out
// as SPEC §7 says: <|image_start|> <|image_pad|>×patches <|image_end|> prompt answer <|endoftext|>.
// Targets are the next token, except where that token is an image position or part of the prompt
// (a record's question): no loss there. <|image_end|>, the answer and the end token are scored.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/core/random.h"
#include "hyla/data/image_augment.h"
#include "hyla/data/image_records.h"
#include "hyla/data/tokenizer.h"
#include "hyla/model/config.h"

namespace hyla {

// Sequences packed one after another, with their images in order.
struct ImageSequences {
  std::vector<int32_t> ids, targets;  // the inputs and their targets (-1: no loss), row by row
  std::vector<int64_t> lengths;       // rows per sequence
  std::vector<Image> images;          // as the model reads them (to_model_image)
  int64_t rows() const { return int64_t(ids.size()); }
  void clear();
};

// The prompt's ids for record r: the image span and the record's prompt (question), which a model
// continues with the answer; and the answer's ids (without the end token).
struct ImagePrompt {
  std::vector<int32_t> prompt, answer;
  Image image;
};
ImagePrompt image_prompt(const ImageRecord& record, const Tokenizer& tokenizer, const VisionConfig& vision,
                         const std::string& source);

// Appends record r as one training sequence (fits the image to the model: channels, padding).
void append_image_sequence(const ImageRecord& record, const Tokenizer& tokenizer, const VisionConfig& vision,
                           const std::string& source, ImageSequences& out);

// The records of one split of a `hyla data prepare-images` / `prepare-documents` directory.
ImageRecordReader open_image_split(const std::filesystem::path& dir, const std::string& split);

// Training draws: records at random over the splits of one or more directories, as many as a
// budget of rows holds (at least one). With `weights` (one per directory, any positive scale) a
// directory is drawn by its weight, then a record of it uniformly; without, every record is equally
// likely, so a set weighs by its size. With `augments` (one per directory) each drawn image is
// augmented as its directory's entry says (data/image_augment.h). A seeded hyla::Rng whose state
// round-trips through JSON, for exact resume.
class ImageRecordSampler {
 public:
  ImageRecordSampler(const std::vector<std::filesystem::path>& dirs, const std::string& split, const Tokenizer& tokenizer,
                     const VisionConfig& vision, uint64_t seed, const std::vector<double>& weights = {},
                     const std::vector<ImageAugment>& augments = {});
  void next(int64_t rows, ImageSequences& out);
  uint64_t size() const { return total_; }
  nlohmann::json state() const;
  void set_state(const nlohmann::json& state);

 private:
  int64_t draw();  // a record's index over all sets
  std::vector<ImageRecordReader> sets_;
  std::vector<std::string> sources_;
  uint64_t total_ = 0;
  std::vector<double> cumulative_weights_;  // empty: records uniformly
  std::vector<ImageAugment> augments_;      // empty: none
  const Tokenizer& tokenizer_;
  VisionConfig vision_;
  Rng rng_;
  // A drawn record (its index over all sets) that did not fit the last budget: the next batch starts with it.
  int64_t pending_ = -1;
};

}  // namespace hyla
