#pragma once
// Image classification and question answering by greedy generation (`hyla eval images`): each
// record's image and prompt (its question, if any) go through the scheduler as any request would,
// and the model's answer is compared with the record's answer exactly (surrounding whitespace
// ignored). Controls change the image, never the prompt: its patches shuffled (the same pixels in
// a seeded random layout) or blank (all zero), so an accuracy that survives them was not read
// from the image.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/core/random.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/scheduler.h"
#include "hyla/model/model.h"

namespace hyla {

enum class ImageControl : uint8_t { None, ShuffledPatches, Blank };
inline constexpr ImageControl kImageControls[] = {ImageControl::None, ImageControl::ShuffledPatches, ImageControl::Blank};
const char* to_string(ImageControl control);  // "images", "shuffled_patches", "blank"

// The control's version of a model image: P×P patches permuted by `rng`, or every pixel 0.
Image apply_control(const Image& image, ImageControl control, int64_t patch_size, Rng& rng);

struct ImageEvalOptions {
  std::string split = "test";
  int64_t limit = 0;  // the split's first N records; 0: all
  ImageControl control = ImageControl::None;
  uint64_t seed = 1;  // the shuffled-patches permutations
  int64_t max_tokens = 24;
  int64_t max_sequences = 16;
  Precision precision = Precision::BF16;
  bool progress = true;
  int64_t examples = 24;  // the first records' images (after the control) kept for a report
};

struct ImageAnswer {
  int64_t record = 0;
  int32_t label = -1;
  std::string expected, output;
  bool correct = false;
};

struct ImageEvalResult {
  std::vector<ImageAnswer> answers;
  std::vector<Image> examples;  // the model images of answers[0 .. options.examples)
  double seconds = 0;
  int64_t image_positions = 0, prompt_tokens = 0, generated_tokens = 0;
  int64_t correct() const;
};

ImageEvalResult evaluate_images(Model& model, const Tokenizer& tokenizer, const std::filesystem::path& dir,
                                const ImageEvalOptions& options);

}  // namespace hyla
