#include "hyla/eval/perplexity.h"

#include <chrono>
#include <memory>

#include "hyla/core/progress.h"
#include "hyla/data/loader.h"
#include "hyla/eval/next_token_input.h"

namespace hyla {

PerplexityResult evaluate_perplexity(Model& model, const std::filesystem::path& data_dir, const std::string& split,
                                     int64_t seq_len, int64_t batch, Precision precision, bool progress,
                                     int64_t max_batches) {
  const auto t0 = std::chrono::steady_clock::now();
  TokenLoader loader = TokenLoader::from_directory(data_dir, split, batch, seq_len, LoaderMode::Sequential);
  std::unique_ptr<Progress> bar;
  if (progress) bar = std::make_unique<Progress>("eval " + split, loader.windows_per_pass(), "windows");
  TokenWindows windows;
  PerplexityResult r;
  double total = 0;
  for (int64_t i = 0; (max_batches == 0 || i < max_batches) && loader.next(windows); ++i) {
    const ModelInput in = next_token_input(windows);
    if (bar) bar->advance(uint64_t(windows.used_rows()));
    if (in.tokens.rows == 0) continue;
    const LossResult l = model.forward(in, {.precision = precision, .outputs = Outputs::None}).loss;
    total += l.loss * double(l.targets);
    r.tokens += l.targets;
  }
  if (bar) bar->finish();
  r.loss = r.tokens ? total / double(r.tokens) : NAN;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace hyla
