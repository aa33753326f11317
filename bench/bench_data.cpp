// Tokenizer speed on one thread, on the King James Bible (`bible` program, ~4.1 MB of text):
// BPE training to 8192 tokens, encoding with a warm piece cache (the steady state of a long
// corpus) and a cold one (a fresh tokenizer each time), encoding random bytes (mostly invalid
// UTF-8: the worst case), and decoding.
#include <benchmark/benchmark.h>

#include <string_view>

#include "hyla/core/random.h"
#include "hyla/core/threads.h"
#include "hyla/data/bpe_trainer.h"
#include "hyla/data/corpus.h"
#include "hyla/data/tokenizer.h"

namespace {

const std::string& kjv() {
  static const std::string text = hyla::kjv_text();
  return text;
}

const hyla::TokenizerSpec& kjv_spec() {
  static const hyla::TokenizerSpec spec = [] {
    const std::string_view texts[] = {kjv()};
    hyla::BpeTrainOptions options;
    options.vocab_size = 8192;
    return hyla::train_bpe(texts, options);
  }();
  return spec;
}

const hyla::Tokenizer& kjv_tokenizer() {
  static const hyla::Tokenizer tokenizer(kjv_spec(), "kjv");
  return tokenizer;
}

void BM_TrainBpeKjv8192(benchmark::State& state) {
  const std::string_view texts[] = {kjv()};
  hyla::BpeTrainOptions options;
  options.vocab_size = 8192;
  for (auto _ : state) {
    hyla::TokenizerSpec spec = hyla::train_bpe(texts, options);
    benchmark::DoNotOptimize(spec.merges.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * kjv().size()));
}

void BM_EncodeKjvWarm(benchmark::State& state) {
  const hyla::Tokenizer& tok = kjv_tokenizer();
  std::vector<int32_t> ids = tok.encode(kjv());  // fills this thread's piece cache
  for (auto _ : state) {
    ids.clear();
    tok.encode_append(kjv(), false, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * kjv().size()));
  state.counters["tokens"] = double(ids.size());
}

void BM_EncodeKjvCold(benchmark::State& state) {
  std::vector<int32_t> ids;
  for (auto _ : state) {
    state.PauseTiming();
    const hyla::Tokenizer fresh(kjv_spec(), "kjv");  // a new tokenizer starts with an empty cache
    ids.clear();
    state.ResumeTiming();
    fresh.encode_append(kjv(), false, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * kjv().size()));
}

void BM_EncodeRandomBytes(benchmark::State& state) {
  const hyla::Tokenizer& tok = kjv_tokenizer();
  hyla::Rng rng(1);
  std::string bytes(1 << 20, '\0');
  for (char& c : bytes) c = char(rng.below(256));
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    tok.encode_append(bytes, false, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * bytes.size()));
}

void BM_DecodeKjv(benchmark::State& state) {
  const hyla::Tokenizer& tok = kjv_tokenizer();
  const std::vector<int32_t> ids = tok.encode(kjv());
  for (auto _ : state) {
    std::string text = tok.decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations() * kjv().size()));
}

BENCHMARK(BM_TrainBpeKjv8192)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeKjvWarm)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeKjvCold)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeRandomBytes)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_DecodeKjv)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

int main(int argc, char** argv) {
  hyla::set_threads(1);  // one core: the figures are per core
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
