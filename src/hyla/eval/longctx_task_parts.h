#pragma once
// What the long-context task families (longctx_task_*.cpp) share: the sample being made, the
// random draws, and the two ways a context is built: planted sentences placed among haystack
// sentences, or a generated list that is the whole context. longctx_tasks.cpp names the tasks and
// builds the contexts; each family writes its instruction, facts, question and answers.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/eval/longctx_tasks.h"

namespace hyla {

// A sample being made: make_longctx_sample's arguments and the sample's random stream.
struct SampleRequest {
  const LongCtxTask& task;
  const Haystack& haystack;
  const Tokenizer& tokenizer;
  int64_t length;
  double depth;
  bool no_context;
  bool paraphrased;  // LongCtxWording::Paraphrased: each family's other words for its template
  Rng& rng;
};

// ---- planted sentences in a haystack ----------------------------------------------------------

// RULER's repeated-noise haystack: one unit, repeated.
inline constexpr std::string_view kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// What fills the context around the planted sentences: RULER's repeated noise, the haystack text,
// or sentences the task generates (Needles::filler_sentence: RULER's haystack made of needles).
enum class Filler : uint8_t { Noise, Essay, Generated };

enum class Placement : uint8_t {
  AtDepth,  // the first at the request's depth, the others at random places
  Spread,   // at random places, in their order (BABILong's facts among the text)
};

struct Needles {
  std::string prefix, suffix;        // the instruction before the context, the question after it
  std::vector<std::string> planted;  // in the order they appear
  Placement placement = Placement::Spread;
  std::vector<std::string> expected;
  std::function<std::string()> filler_sentence;  // Filler::Generated's next sentence
};

// The sample whose context is filler up to the length with `needles` planted in it (no filler
// with no_context). Throws when the length cannot hold the instruction, facts and question.
LongCtxSample haystack_sample(const SampleRequest& request, Filler filler, const Needles& needles);

// ---- a generated list as the context ----------------------------------------------------------

// The tokens the list may take: the length less the instruction, the question, the answer and
// `reserve` (what the question grows by once it names what the list drew).
int64_t list_budget(const SampleRequest& request, std::string_view prefix, std::string_view suffix, int64_t reserve);

// `sample` with its prompt: the instruction, the items (none with no_context) and the question.
LongCtxSample list_sample(const SampleRequest& request, std::string_view prefix,
                          const std::vector<std::vector<int32_t>>& items, std::string_view suffix, LongCtxSample sample);

// Items whose count is chosen so that their tokens (each as " item") fill `budget`: `make(n)`
// builds n items; the count is estimated from a probe and shrunk until the items fit.
template <typename Make>
std::vector<std::vector<int32_t>> fill_items(const Tokenizer& tokenizer, int64_t budget, const Make& make) {
  auto tokenise = [&](const std::vector<std::string>& items, int64_t& total) {
    std::vector<std::vector<int32_t>> ids;
    ids.reserve(items.size());
    total = 0;
    for (const std::string& item : items) {
      ids.push_back(tokenizer.encode(" " + item));
      total += int64_t(ids.back().size());
    }
    return ids;
  };
  int64_t total = 0;
  tokenise(make(64), total);
  int64_t n = std::max<int64_t>(1, budget * 64 / std::max<int64_t>(total, 1));
  for (int attempt = 0; attempt < 12; ++attempt) {
    auto ids = tokenise(make(n), total);
    if (total <= budget) return ids;
    n = std::max<int64_t>(1, std::min(n - 1, int64_t(double(n) * double(budget) / double(total) * 0.99)));
  }
  fail("could not fit the list into {} tokens", budget);
}

// ---- random draws -----------------------------------------------------------------------------

// A number of `digits` digits, the first not 0.
inline std::string random_digits(Rng& rng, int digits) {
  std::string s(size_t(digits), '0');
  s[0] = char('1' + rng.below(9));
  for (int i = 1; i < digits; ++i) s[size_t(i)] = char('0' + rng.below(10));
  return s;
}

// `n` distinct indexes below `size`, in the order drawn.
inline std::vector<size_t> distinct_indices(Rng& rng, size_t size, size_t n) {
  HYLA_ASSERT(n <= size);
  std::set<size_t> chosen;
  std::vector<size_t> out;
  while (out.size() < n) {
    const size_t i = size_t(rng.below(size));
    if (chosen.insert(i).second) out.push_back(i);
  }
  return out;
}

// `n` distinct picks from `pool`.
inline std::vector<std::string> distinct(Rng& rng, const std::vector<std::string>& pool, size_t n) {
  std::vector<std::string> out;
  for (size_t i : distinct_indices(rng, pool.size(), n)) out.push_back(pool[i]);
  return out;
}

// ---- the families -----------------------------------------------------------------------------

// longctx_task_niah.cpp: a pass key in noise, and RULER's needles (word -> number or UUID).
enum class NeedleValue : uint8_t { Number, Uuid };
LongCtxSample passkey_sample(const SampleRequest& request);
// `keys` needles with distinct keys; the first is asked, the others distract.
LongCtxSample single_needle_sample(const SampleRequest& request, Filler filler, NeedleValue value, size_t keys);
// RULER's niah_multikey_2/3: the asked needle at the depth, every other sentence a needle with
// another key (a word and a number, or two UUIDs).
LongCtxSample needle_haystack_sample(const SampleRequest& request, NeedleValue value);
LongCtxSample multivalue_sample(const SampleRequest& request);
LongCtxSample multiquery_sample(const SampleRequest& request);

// longctx_task_vt.cpp: variable tracking, "vt_CxH" (C chains of H hops, C 1-4, H 1-16).
bool parse_variable_tracking(const std::string& name, int& chains, int& hops);
LongCtxSample variable_tracking_sample(const SampleRequest& request);

// longctx_task_babi.cpp: bAbI's QA1-3 stories, `qa` 1 to 3.
LongCtxSample babi_sample(const SampleRequest& request, int qa);

// longctx_task_words.cpp: the common words of a list, the frequent words of a coded text.
LongCtxSample common_words_sample(const SampleRequest& request);
LongCtxSample frequent_words_sample(const SampleRequest& request);

// longctx_task_mqar.cpp: multi-query associative recall.
LongCtxSample associative_recall_sample(const SampleRequest& request);

}  // namespace hyla
