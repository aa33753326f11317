#include "hyla/data/image_batches.h"

#include <fmt/format.h>

#include <cmath>

#include "hyla/core/error.h"
#include "hyla/data/image_file.h"
#include "hyla/data/image_text.h"
#include "hyla/io/json_fields.h"

namespace hyla {
namespace fs = std::filesystem;

void ImageSequences::clear() {
  ids.clear();
  targets.clear();
  lengths.clear();
  images.clear();
}

ImagePrompt image_prompt(const ImageRecord& record, const Tokenizer& tokenizer, const VisionConfig& vision,
                         const std::string& source) {
  HYLA_CHECK(vision.enabled, "{}: image records need a model with vision.enabled", source);
  const Image stored{record.height, record.width, record.channels,
                     std::vector<uint8_t>(record.pixels.begin(), record.pixels.end())};
  ImagePrompt p;
  p.image = to_model_image(stored, vision, source, /*fit=*/true);
  const std::string_view question = record.caption.substr(0, size_t(record.prompt_bytes));
  append_image_span(tokenizer, p.image, vision.position_pixels(), p.prompt);
  tokenizer.encode_append(question, false, p.prompt);
  p.answer = tokenizer.encode(record.caption.substr(size_t(record.prompt_bytes)));
  return p;
}

void append_image_sequence(const ImageRecord& record, const Tokenizer& tokenizer, const VisionConfig& vision,
                           const std::string& source, ImageSequences& out) {
  ImagePrompt p = image_prompt(record, tokenizer, vision, source);
  const int32_t pad = tokenizer.special_id("<|image_pad|>");
  std::vector<int32_t> ids = std::move(p.prompt);
  const size_t scored_from = ids.size();  // the first answer token's index
  ids.insert(ids.end(), p.answer.begin(), p.answer.end());
  ids.push_back(tokenizer.special_id("<|endoftext|>"));
  for (size_t r = 0; r + 1 < ids.size(); ++r) {
    const int32_t next = ids[r + 1];
    const bool in_prompt = r + 1 < scored_from && next != tokenizer.special_id("<|image_end|>");
    out.ids.push_back(ids[r]);
    out.targets.push_back(next == pad || in_prompt ? -1 : next);
  }
  out.lengths.push_back(int64_t(ids.size()) - 1);
  out.images.push_back(std::move(p.image));
}

ImageRecordReader open_image_split(const fs::path& dir, const std::string& split) {
  const fs::path meta_file = dir / "meta.json";
  HYLA_CHECK(fs::exists(meta_file), "{}: not a prepared image directory (no meta.json)", dir.string());
  const nlohmann::json meta = parse_json_file(meta_file.string());
  HYLA_CHECK(meta.value("format", "") == "hyla-image-records", "{}: format is not hyla-image-records",
             meta_file.string());
  HYLA_CHECK(meta.contains("splits") && meta["splits"].contains(split), "{}: has no \"{}\" split", meta_file.string(),
             split);
  return ImageRecordReader(dir / meta["splits"][split].at("file").get<std::string>());
}

ImageRecordSampler::ImageRecordSampler(const std::vector<fs::path>& dirs, const std::string& split,
                                       const Tokenizer& tokenizer, const VisionConfig& vision, uint64_t seed,
                                       const std::vector<double>& weights, const std::vector<ImageAugment>& augments)
    : augments_(augments), tokenizer_(tokenizer), vision_(vision), rng_(seed) {
  for (const fs::path& dir : dirs) {
    sets_.push_back(open_image_split(dir, split));
    sources_.push_back(fmt::format("{} ({} split)", dir.string(), split));
    HYLA_CHECK(sets_.back().size() > 0, "{}: no records", sources_.back());
    total_ += sets_.back().size();
  }
  HYLA_CHECK(!sets_.empty(), "image training needs at least one directory of records");
  HYLA_CHECK(augments.empty() || augments.size() == dirs.size(), "images.augment has {} entries for {} image directories",
             augments.size(), dirs.size());
  if (weights.empty()) return;
  HYLA_CHECK(weights.size() == dirs.size(), "images.weights has {} weights for {} image directories", weights.size(),
             dirs.size());
  double sum = 0;
  for (double w : weights) {
    HYLA_CHECK(std::isfinite(w) && w > 0, "images.weights must be positive, got {}", w);
    cumulative_weights_.push_back(sum += w);
  }
}

int64_t ImageRecordSampler::draw() {
  if (cumulative_weights_.empty()) return int64_t(rng_.below(total_));
  const size_t set = rng_.pick(cumulative_weights_);
  uint64_t first = 0;
  for (size_t s = 0; s < set; ++s) first += sets_[s].size();
  return int64_t(first + rng_.below(sets_[set].size()));
}

void ImageRecordSampler::next(int64_t rows, ImageSequences& out) {
  out.clear();
  for (;;) {
    const int64_t i = pending_ >= 0 ? pending_ : draw();
    pending_ = -1;
    uint64_t at = uint64_t(i);
    size_t set = 0;
    while (at >= sets_[set].size()) at -= sets_[set++].size();
    const size_t before = out.ids.size();
    append_image_sequence(sets_[set].record(at), tokenizer_, vision_, fmt::format("{} record {}", sources_[set], at), out);
    if (!augments_.empty() && augments_[set].any()) augment_image(augments_[set], rng_, out.images.back());
    if (out.rows() > rows && out.lengths.size() > 1) {  // over the budget: keep it for the next batch
      out.ids.resize(before);
      out.targets.resize(before);
      out.lengths.pop_back();
      out.images.pop_back();
      pending_ = i;
      return;
    }
    if (out.rows() >= rows) return;
  }
}

nlohmann::json ImageRecordSampler::state() const {
  return {{"rng", rng_.state()}, {"pending", pending_}};
}

void ImageRecordSampler::set_state(const nlohmann::json& state) {
  rng_.set_state(state.at("rng").get<std::array<uint64_t, 5>>());
  pending_ = state.at("pending").get<int64_t>();
}

}  // namespace hyla
