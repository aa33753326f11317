#include "hyla/eval/image_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

#include "hyla/core/clock.h"
#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/core/text.h"
#include "hyla/data/image_batches.h"

namespace hyla {

const char* to_string(ImageControl control) {
  switch (control) {
    case ImageControl::None: return "images";
    case ImageControl::ShuffledPatches: return "shuffled_patches";
    case ImageControl::Blank: return "blank";
  }
  return "?";
}

Image apply_control(const Image& image, ImageControl control, int64_t patch_size, Rng& rng) {
  Image out = image;
  if (control == ImageControl::Blank) std::fill(out.pixels.begin(), out.pixels.end(), uint8_t(0));
  if (control != ImageControl::ShuffledPatches) return out;
  const int64_t P = patch_size, C = image.channels, rows = image.height / P, cols = image.width / P;
  std::vector<int64_t> order(size_t(rows * cols));
  std::iota(order.begin(), order.end(), 0);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(rng.below(i))]);
  for (int64_t to = 0; to < rows * cols; ++to) {
    const int64_t from = order[size_t(to)];
    for (int64_t y = 0; y < P; ++y) {
      const uint8_t* src = image.pixels.data() + ((from / cols * P + y) * image.width + from % cols * P) * C;
      uint8_t* dst = out.pixels.data() + ((to / cols * P + y) * image.width + to % cols * P) * C;
      std::copy(src, src + P * C, dst);
    }
  }
  return out;
}

int64_t ImageEvalResult::correct() const {
  return std::count_if(answers.begin(), answers.end(), [](const ImageAnswer& a) { return a.correct; });
}

ImageEvalResult evaluate_images(Model& model, const Tokenizer& tokenizer, const std::filesystem::path& dir,
                                const ImageEvalOptions& options) {
  const ImageRecordReader records = open_image_split(dir, options.split);
  const int64_t n = options.limit > 0 ? std::min<int64_t>(options.limit, int64_t(records.size())) : int64_t(records.size());
  HYLA_CHECK(n > 0, "{}: the {} split has no records", dir.string(), options.split);
  const VisionConfig& vision = model.config().vision;
  EngineOptions engine;
  engine.max_sequences = options.max_sequences;
  engine.precision = options.precision;
  engine.prefix_cache_bytes = 0;  // every prompt starts with a different image
  engine.prefill_chunk = 512;
  // The longest prompt bounds the context: the image span, the question and the answer.
  int64_t longest = 0;
  ImageEvalResult result;
  std::vector<ImagePrompt> prompts;
  prompts.reserve(size_t(n));
  Rng rng(options.seed);
  for (int64_t i = 0; i < n; ++i) {
    ImagePrompt p = image_prompt(records.record(uint64_t(i)), tokenizer, vision,
                                 fmt::format("{} ({} split) record {}", dir.string(), options.split, i));
    p.image = apply_control(p.image, options.control, vision.patch_size, rng);
    if (i < options.examples) result.examples.push_back(p.image);
    longest = std::max<int64_t>(longest, int64_t(p.prompt.size()));
    prompts.push_back(std::move(p));
  }
  engine.context = longest + options.max_tokens + 1;
  Scheduler scheduler(model, tokenizer, engine);
  const int32_t image_pad = tokenizer.special_id("<|image_pad|>");
  result.answers.resize(size_t(n));
  const auto start = std::chrono::steady_clock::now();
  std::map<Scheduler::RequestId, int64_t> in_flight;
  std::optional<Progress> progress;
  if (options.progress) progress.emplace(fmt::format("eval images ({})", to_string(options.control)), uint64_t(n), "images");
  int64_t next = 0, done = 0;
  while (done < n) {
    while (next < n && int64_t(in_flight.size()) < 2 * options.max_sequences) {
      GenerationRequest r;
      r.prompt = prompts[size_t(next)].prompt;
      r.images = {std::move(prompts[size_t(next)].image)};
      r.max_tokens = options.max_tokens;
      r.sampling.temperature = 0;
      result.image_positions += std::count(r.prompt.begin(), r.prompt.end(), image_pad);
      result.prompt_tokens += int64_t(r.prompt.size());
      in_flight[scheduler.add(std::move(r))] = next++;
    }
    for (Scheduler::Finished& f : scheduler.step()) {
      if (f.error) std::rethrow_exception(f.error);
      const int64_t i = in_flight.at(f.id);
      in_flight.erase(f.id);
      const ImageRecord record = records.record(uint64_t(i));
      ImageAnswer& a = result.answers[size_t(i)];
      a.record = i;
      a.label = record.label;
      a.expected = std::string(trim_space(record.caption.substr(size_t(record.prompt_bytes))));
      a.output = std::string(trim_space(f.output.text));
      a.correct = a.output == a.expected;
      result.generated_tokens += int64_t(f.output.tokens.size());
      ++done;
      if (progress) progress->advance(1);
    }
  }
  if (progress) progress->finish();
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace hyla
