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
constexpr size_t kAskedAmong = 24;  // the asked keys are among the first drawn (the pairs' order is random)
constexpr int64_t kQuestionReserve = 96;  // the question's tokens: its template and 16 keys
// By wording: RULER's, paraphrased.
constexpr const char* kInstruction[] = {"Remember the value that follows each key.\n",
                                        "Each key below comes with a value right after it; keep the pairs in mind.\n"};
constexpr const char* kQuestion[] = {"\nQuestion: What value follows each of the keys {}?",
                                     "\nQuestion: Which value comes after each of the keys {}?"};
constexpr const char* kAnswer[] = {" Answer: Each key with its value:", " Answer: The keys and their values:"};
}  // namespace

LongCtxSample associative_recall_sample(const SampleRequest& request) {
  const bool p = request.paraphrased;
  const std::string prefix = kInstruction[p];
  const std::vector<std::string>& words = request.haystack.short_words();
  // Every other word each, so the two sets are disjoint; none of the words of the noise or of the
  // prompt's own text, which would read as pairs ("back again.", "each key.").
  std::vector<std::string> keys, values;
  // Both wordings' words, so both draw the same keys and values.
  std::string fixed = fmt::format("{} {} {} {} {} {} {}", kNoise, kInstruction[0], kInstruction[1], kQuestion[0],
                                  kQuestion[1], kAnswer[0], kAnswer[1]);
  for (char& c : fixed) c = char(std::tolower(uint8_t(c)));
  for (const std::string& word : words) {
    if (fixed.find(word) != std::string::npos) continue;
    (keys.size() == values.size() ? keys : values).push_back(word);
  }
  HYLA_CHECK(keys.size() >= kAskedAmong, "mqar needs {} keys, more than the haystack's {} distinct words make",
             kAskedAmong, words.size());
  const int64_t budget = request.length - int64_t(request.tokenizer.encode(prefix).size()) - request.task.max_tokens -
                         kQuestionReserve - 16;
  // Every draw comes before the length cuts the list, so both wordings ask the same pairs.
  Rng& rng = request.rng;
  const std::vector<std::string> drawn = distinct(rng, keys, std::min(kMaxPairs, keys.size()));
  std::vector<std::string> pair_of;  // "key value" of each drawn key
  for (const std::string& key : drawn) pair_of.push_back(key + " " + values[rng.below(values.size())]);
  const std::vector<size_t> asked_at = distinct_indices(rng, kAskedAmong, kQueries);
  Needles n;
  int64_t used = 0;
  for (const std::string& pair : pair_of) {
    const int64_t tokens = int64_t(request.tokenizer.encode(" " + pair + ".").size());
    if (used + tokens > budget) break;
    used += tokens;
    n.planted.push_back(pair + ".");
  }
  HYLA_CHECK(n.planted.size() >= kAskedAmong, "mqar needs more than {} tokens", request.length);
  std::string asked;
  for (size_t i : asked_at) {
    asked += fmt::format("{}{}", asked.empty() ? "" : ", ", drawn[i]);
    n.expected.push_back(pair_of[i]);
  }
  n.placement = Placement::Spread;
  n.prefix = prefix;
  n.suffix = fmt::format(fmt::runtime(kQuestion[p]), asked) + kAnswer[p];
  return haystack_sample(request, Filler::Noise, n);
}

}  // namespace hyla
