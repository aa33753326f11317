// Multi-query associative recall in Zoology's form (Arora et al., 2023): one-token keys, each
// followed by a one-token value (from a disjoint set of words; Haystack::short_words, one token
// each under a tokenizer trained on the haystack's kind of text), fill the context, up to 256 pairs
// and RULER's noise after that; the question asks 16 of the keys and the answer gives each with
// its value, every one scored. An architecture check for small models.
#include <fmt/format.h>

#include <cctype>

#include "hyla/eval/longctx_task_parts.h"

namespace hyla {

namespace {
constexpr size_t kMaxPairs = 256;
constexpr size_t kQueries = 16;
constexpr int64_t kQuestionReserve = 96;  // the question's tokens: its template and 16 keys
constexpr const char* kQuestion = "\nQuestion: What value follows each of the keys {}?";
constexpr const char* kAnswer = " Answer: Each key with its value:";
}  // namespace

LongCtxSample associative_recall_sample(const SampleRequest& request) {
  const std::string prefix = "Remember the value that follows each key.\n";
  const std::vector<std::string>& words = request.haystack.short_words();
  // Every other word each, so the two sets are disjoint; none of the words of the noise or of the
  // prompt's own text, which would read as pairs ("back again.", "each key.").
  std::vector<std::string> keys, values;
  std::string fixed = fmt::format("{} {} {} {}", kNoise, prefix, kQuestion, kAnswer);
  for (char& c : fixed) c = char(std::tolower(uint8_t(c)));
  for (const std::string& word : words) {
    if (fixed.find(word) != std::string::npos) continue;
    (keys.size() == values.size() ? keys : values).push_back(word);
  }
  HYLA_CHECK(keys.size() >= 2 * kQueries, "mqar needs {} keys, more than the haystack's {} distinct words make",
             2 * kQueries, words.size());
  const int64_t budget = request.length - int64_t(request.tokenizer.encode(prefix).size()) - request.task.max_tokens -
                         kQuestionReserve - 16;
  Rng& rng = request.rng;
  const std::vector<std::string> drawn = distinct(rng, keys, std::min(kMaxPairs, keys.size()));
  Needles n;
  std::vector<std::string> pair_of;  // "key value" of each planted pair
  int64_t used = 0;
  for (const std::string& key : drawn) {
    const std::string pair = key + " " + values[rng.below(values.size())];
    const int64_t tokens = int64_t(request.tokenizer.encode(" " + pair + ".").size());
    if (used + tokens > budget) break;
    used += tokens;
    pair_of.push_back(pair);
    n.planted.push_back(pair + ".");
  }
  HYLA_CHECK(pair_of.size() >= kQueries, "mqar needs more than {} tokens", request.length);
  std::string asked;
  for (size_t i : distinct_indices(rng, pair_of.size(), kQueries)) {
    asked += fmt::format("{}{}", asked.empty() ? "" : ", ", drawn[i]);
    n.expected.push_back(pair_of[i]);
  }
  n.placement = Placement::Spread;
  n.prefix = prefix;
  n.suffix = fmt::format(fmt::runtime(kQuestion), asked) + kAnswer;
  return haystack_sample(request, Filler::Noise, n);
}

}  // namespace hyla
