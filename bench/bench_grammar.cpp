// The grammar mask of constrained sampling (infer/grammar.h) on one thread, over an 8192-token BPE
// of the King James Bible: the trie walk over the byte-sorted vocabulary (warm: its states and
// transitions remembered, as from the second token on; cold: the first mask at that point) against
// the plain way (each token checked alone from a copy of the matcher), at three points of a JSON Schema
// instance: where a property name starts (few tokens fit), inside a free string (most fit: the
// worst case) and inside a number. Bytes walked per second are reported to compare with read
// bandwidth; the walk is branchy scalar code, bounded by neither FLOPs nor bandwidth.
#include <benchmark/benchmark.h>

#include <nlohmann/json.hpp>

#include <cstdio>

#include "hyla/core/threads.h"
#include "hyla/data/bpe_trainer.h"
#include "hyla/data/corpus.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/grammar.h"
#include "hyla/infer/json_grammar.h"
#include "hyla/kernels/bandwidth.h"

namespace {

const hyla::Tokenizer& kjv_tokenizer() {
  static const hyla::Tokenizer tokenizer = [] {
    const std::string text = hyla::kjv_text();
    const std::string_view texts[] = {text};
    hyla::BpeTrainOptions options;
    options.vocab_size = 8192;
    return hyla::Tokenizer(hyla::train_bpe(texts, options), "kjv");
  }();
  return tokenizer;
}

const hyla::Grammar& schema_grammar() {
  static const auto grammar = hyla::json_schema_grammar(
      nlohmann::json::parse(R"({"type": "object", "properties": {"verse": {"type": "string"}, "chapter": {"type": "integer"},
          "book": {"enum": ["Genesis", "Exodus"]}, "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["book", "chapter", "verse"]})"),
      "bench");
  return *grammar;
}

// The text before each measured point.
const char* const kPoints[] = {R"({"book": "Genesis", )", R"({"book": "Genesis", "chapter": 1, "tags": ["in the be)",
                               R"({"book": "Genesis", "chapter": 12)"};
const char* const kPointNames[] = {"property name", "inside a string", "inside a number"};

int64_t vocabulary_bytes(const hyla::Tokenizer& tok) {
  int64_t bytes = 0;
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (!tok.is_special(id)) bytes += int64_t(tok.decode_token(id).size());
  return bytes;
}

void BM_GrammarMaskTrieWalk(benchmark::State& state) {
  const hyla::Tokenizer& tok = kjv_tokenizer();
  const hyla::GrammarVocabulary vocabulary(tok);
  hyla::GrammarMatcher matcher(schema_grammar());
  matcher.accept_bytes(kPoints[state.range(0)]);
  std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
  for (auto _ : state) {
    matcher.allowed(vocabulary, allowed.data());
    benchmark::DoNotOptimize(allowed.data());
  }
  int64_t count = 0;
  for (const uint8_t a : allowed) count += a;
  state.SetLabel(kPointNames[state.range(0)]);
  state.counters["allowed"] = double(count);
  state.SetBytesProcessed(state.iterations() * vocabulary_bytes(tok));
}

// The first mask at a point: the states and transitions it needs are not remembered yet.
void BM_GrammarMaskTrieWalkCold(benchmark::State& state) {
  const hyla::Tokenizer& tok = kjv_tokenizer();
  const hyla::GrammarVocabulary vocabulary(tok);
  std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
  for (auto _ : state) {
    state.PauseTiming();
    hyla::GrammarMatcher matcher(schema_grammar());
    matcher.accept_bytes(kPoints[state.range(0)]);
    state.ResumeTiming();
    matcher.allowed(vocabulary, allowed.data());
    benchmark::DoNotOptimize(allowed.data());
  }
  state.SetLabel(kPointNames[state.range(0)]);
  state.SetBytesProcessed(state.iterations() * vocabulary_bytes(tok));
}

void BM_GrammarMaskEachTokenAlone(benchmark::State& state) {
  const hyla::Tokenizer& tok = kjv_tokenizer();
  hyla::GrammarMatcher matcher(schema_grammar());
  matcher.accept_bytes(kPoints[state.range(0)]);
  std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
  for (auto _ : state) {
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      hyla::GrammarMatcher alone = matcher;
      allowed[size_t(id)] = tok.is_special(id) ? alone.accept_special(id) : alone.accept_bytes(tok.decode_token(id));
    }
    benchmark::DoNotOptimize(allowed.data());
  }
  state.SetLabel(kPointNames[state.range(0)]);
  state.SetBytesProcessed(state.iterations() * vocabulary_bytes(tok));
}

BENCHMARK(BM_GrammarMaskTrieWalk)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond)->MinTime(1.0);
BENCHMARK(BM_GrammarMaskTrieWalkCold)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond)->MinTime(1.0);
BENCHMARK(BM_GrammarMaskEachTokenAlone)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond)->MinTime(1.0);

}  // namespace

int main(int argc, char** argv) {
  hyla::set_threads(1);
  kjv_tokenizer();  // trained before the timings
  std::printf("one-thread read bandwidth of a fresh 512 MB buffer: %.1f GB/s\n", hyla::measure_read_bandwidth_gbs());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
