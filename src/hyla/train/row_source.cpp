#include "hyla/train/row_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <utility>

#include "hyla/core/error.h"
#include "hyla/data/image_batches.h"
#include "hyla/eval/next_token_input.h"
#include "hyla/train/agent_mix.h"
#include "hyla/train/longctx_mix.h"

namespace hyla {
namespace {

// `ratio` rows per text row, at least one.
int64_t rows_per_text_row(double ratio, double text_rows) { return std::max<int64_t>(1, std::llround(ratio * text_rows)); }

// A source that draws its sequences from a sampler, whose state is the source's.
template <class Sampler>
class SampledRows : public RowSource {
 public:
  nlohmann::json state() const override { return sampler_.state(); }
  void set_state(const nlohmann::json& state) override { sampler_.set_state(state); }

 protected:
  template <class... Args>
  explicit SampledRows(Args&&... sampler_args) : sampler_(std::forward<Args>(sampler_args)...) {}
  Sampler sampler_;
  ImageSequences sequences_;
};

class ImageRows final : public SampledRows<ImageRecordSampler> {
 public:
  ImageRows(const TrainConfig& c, const std::vector<std::string>& dirs, const Tokenizer& tokenizer, const VisionConfig& vision)
      : SampledRows(std::vector<std::filesystem::path>(dirs.begin(), dirs.end()), "train", tokenizer, vision, c.seed + 1,
                    c.image_weights, c.image_augment),
        ratio_(c.image_ratio),
        image_pad_id_(tokenizer.special_id("<|image_pad|>")) {
    fmt::print("images {}: {} training records, {:g} image rows per text row{}\n", fmt::join(dirs, ", "),
               sampler_.size(), c.image_ratio,
               c.image_weights.empty() ? "" : fmt::format(", directories weighted {}", fmt::join(c.image_weights, ":")));
    for (size_t i = 0; i < c.image_augment.size(); ++i)
      if (c.image_augment[i].any())
        fmt::print("images {}: augmented (mirror with probability {:g}, shifts up to {} pixels)\n", dirs[i],
                   c.image_augment[i].flip, c.image_augment[i].shift);
  }
  const char* name() const override { return "images"; }
  int64_t rows(int64_t, double text_rows) const override { return rows_per_text_row(ratio_, text_rows); }
  void append(ModelInput& in, int64_t, int64_t rows) override {
    sampler_.next(rows, sequences_);
    append_image_sequences(in, sequences_, image_pad_id_);
  }

 private:
  double ratio_;
  int32_t image_pad_id_;
};

class LongCtxRows final : public SampledRows<LongCtxSampler> {
 public:
  LongCtxRows(const TrainConfig& c, const Tokenizer& tokenizer)
      : SampledRows(c.longctx_tasks, c.longctx_haystack, tokenizer, c.seed, c.longctx_weights), config_(c) {
    fmt::print("longctx: {} ({}), {:g} rows per text row where a stage sets none, one sample per stage length{}\n",
               fmt::join(c.longctx_tasks, ", "), c.longctx_haystack, c.longctx_ratio,
               c.longctx_weights.empty() ? "" : fmt::format(", tasks weighted {}", c.longctx_weights));
    for (int64_t stage = 0; stage < int64_t(c.curriculum.size()); ++stage)
      if (c.longctx_ratio_of(stage) > 0) sampler_.check_fit(c.curriculum[size_t(stage)].seq_len, c.longctx_tasks_of(stage));
  }
  const char* name() const override { return "longctx"; }
  int64_t rows(int64_t stage, double text_rows) const override {
    const double ratio = config_.longctx_ratio_of(stage);
    return ratio > 0 ? rows_per_text_row(ratio, text_rows) : 0;
  }
  void append(ModelInput& in, int64_t stage, int64_t rows) override {
    sampler_.next(rows, config_.curriculum[size_t(stage)].seq_len, config_.longctx_tasks_of(stage), sequences_);
    append_image_sequences(in, sequences_, in.image_pad_id);
  }
  bool runs_at_stage_length() const override { return true; }
  double loss_share(int64_t stage) const override { return config_.longctx_answer_share_of(stage); }
  std::string stage_note(int64_t stage) const override {
    const double share = loss_share(stage);
    return fmt::format(", longctx {:g} rows per text row of {}{}", config_.longctx_ratio_of(stage),
                       fmt::join(config_.longctx_tasks_of(stage), ", "),
                       share == -1 ? "" : fmt::format(" (answers {:g}% of the loss)", 100 * share));
  }

 private:
  const TrainConfig& config_;
};

class AgentRows final : public SampledRows<AgentDemoSampler> {
 public:
  AgentRows(const TrainConfig& c, const Tokenizer& tokenizer)
      : SampledRows(c.agent_environments, c.agent_fault_share, tokenizer, c.seed), ratio_(c.agent_ratio) {
    fmt::print("agent demonstrations: {} (faults in {:g} of calls), {:g} rows per text row, loss on assistant turns\n",
               fmt::join(c.agent_environments, ", "), c.agent_fault_share, c.agent_ratio);
  }
  const char* name() const override { return "agent"; }
  int64_t rows(int64_t, double text_rows) const override { return rows_per_text_row(ratio_, text_rows); }
  void append(ModelInput& in, int64_t, int64_t rows) override {
    sampler_.next(rows, sequences_);
    append_image_sequences(in, sequences_, in.image_pad_id);
  }

 private:
  double ratio_;
};

}  // namespace

void apply_loss_shares(ModelInput& in, const std::vector<LossShare>& shares) {
  const int64_t n = int64_t(in.targets.size());
  std::vector<int64_t> owner(size_t(n), -1);  // the share range of each row, -1: the rest
  double shared = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    const LossShare& s = shares[i];
    HYLA_ASSERT(s.first >= 0 && s.first <= s.end && s.end <= n);
    if (s.share == -1) continue;
    HYLA_ASSERT(s.share > 0 && s.share < 1);
    for (int64_t r = s.first; r < s.end; ++r) owner[size_t(r)] = int64_t(i);
  }
  std::vector<int64_t> scored(shares.size(), 0);
  int64_t rest = 0, total = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (in.targets[size_t(r)] < 0) continue;
    ++total;
    if (owner[size_t(r)] < 0) ++rest;
    else ++scored[size_t(owner[size_t(r)])];
  }
  for (size_t i = 0; i < shares.size(); ++i)
    if (scored[i] > 0) shared += shares[i].share;
  if (shared == 0) return;
  HYLA_ASSERT(shared < 1 || rest == 0);
  const double scale = rest > 0 ? 1.0 : 1.0 / shared;  // nothing else scored: the shares make up the whole
  if (in.loss_weights.empty()) in.loss_weights.assign(size_t(n), 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    if (in.targets[size_t(r)] < 0) continue;
    const int64_t i = owner[size_t(r)];
    const double factor = i < 0 ? (1 - shared) * double(total) / double(rest)
                                : scale * shares[size_t(i)].share * double(total) / double(scored[size_t(i)]);
    in.loss_weights[size_t(r)] *= float(factor);
  }
}

std::vector<std::unique_ptr<RowSource>> make_row_sources(const TrainConfig& c, const std::vector<std::string>& images_dirs,
                                                         const Tokenizer& tokenizer, const VisionConfig& vision) {
  std::vector<std::unique_ptr<RowSource>> sources;
  if (!images_dirs.empty()) sources.push_back(std::make_unique<ImageRows>(c, images_dirs, tokenizer, vision));
  if (c.longctx_ratio > 0) sources.push_back(std::make_unique<LongCtxRows>(c, tokenizer));
  if (c.agent_ratio > 0) sources.push_back(std::make_unique<AgentRows>(c, tokenizer));
  return sources;
}

}  // namespace hyla
