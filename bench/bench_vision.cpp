// Image prefill against text prefill on configs/vision.json (random weights, bf16 products): a
// batch of 16 sequences of one 56×56 grey image each (<|image_start|>, 64 patch positions,
// <|image_end|>: 66 rows) against 16 text sequences of 66 tokens, through the cached forward the
// scheduler uses (last row's logits out). Positions per second for both, and GFLOP/s of the
// model's prefill FLOPs (plan/flops.h, the head on the 16 last rows only) as a fraction of a bf16 2048³ oneDNN GEMM timed first in
// the same run. The difference between the two is the patch embedding (a [64, 49] × [49, d]
// product, row and column embeddings) against the token embedding gather.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <vector>

#include "hyla/infer/sequence_state.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/model_files.h"
#include "hyla/model/model.h"
#include "hyla/model/param_count.h"
#include "hyla/plan/flops.h"

namespace {

using namespace hyla;

constexpr int64_t kSequences = 16, kImageSide = 56, kRows = 66;

struct Setup {
  ModelConfig config = model_config_of(HYLA_SOURCE_DIR "/configs/vision.json");
  Model model{config};
  std::vector<std::unique_ptr<SequenceState>> states;
  double peak = measure_gemm_peak_gflops(true);
  // The LM head runs on each sequence's last row only (the scheduler's prefill), not on every row.
  double head_flops = 2.0 * double(config.vocab_size) * double(config.hidden_size);
  double flops_per_row = token_flops(config, count_parameters(config), kRows).prefill() - head_flops;
  Setup() {
    model.initialize(1);
    for (int64_t i = 0; i < kSequences; ++i) states.push_back(std::make_unique<SequenceState>(model, 128, DType::BF16));
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

// The vision model's ids: 4096-token KJV vocabulary; the specials sit right after the 256 bytes
// and the merges, and which ids they are does not change the work, only that pads are pads.
ModelInput batch(bool images) {
  const ModelConfig& c = setup().config;
  ModelInput in;
  std::mt19937 rng(7);
  const int32_t pad = int32_t(c.vocab_size) - 1, start = pad - 1, end = pad - 2;
  for (int64_t s = 0; s < kSequences; ++s) {
    if (images) {
      in.ids.push_back(start);
      in.ids.insert(in.ids.end(), size_t(kRows - 2), pad);
      in.ids.push_back(end);
      Image img{kImageSide, kImageSide, 1, std::vector<uint8_t>(size_t(kImageSide * kImageSide))};
      for (uint8_t& v : img.pixels) v = uint8_t(rng());
      in.images.push_back(std::move(img));
    } else {
      for (int64_t t = 0; t < kRows; ++t) in.ids.push_back(int32_t(rng() % 4000));
    }
  }
  if (images) in.image_pad_id = pad;
  in.tokens = TokenBatch::packed(std::vector<int64_t>(size_t(kSequences), kRows));
  return in;
}

void BM_prefill(benchmark::State& state) {
  const bool images = state.range(0) == 1;
  Setup& s = setup();
  const ModelInput in = batch(images);
  auto run = [&] {
    std::vector<SequenceCache> caches;
    for (auto& st : s.states) {
      st->reset();
      caches.push_back(st->cache());
    }
    return s.model.forward(in, {.precision = Precision::BF16, .outputs = Outputs::LastOfEachSequence}, caches);
  };
  run();  // grows the workspace
  for (auto _ : state) benchmark::DoNotOptimize(run().logits.data<float>());
  const double rows = double(kSequences * kRows);
  state.counters["positions_per_s"] = benchmark::Counter(rows, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs"] = benchmark::Counter((rows * s.flops_per_row + kSequences * s.head_flops) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_GFLOPs"] = s.peak;
  state.SetLabel(images ? "16 x (56x56 image: 66 positions)" : "16 x 66 text tokens");
}
BENCHMARK(BM_prefill)->Arg(1)->Arg(0)->ArgName("images")->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
