// RULER's aggregation tasks, where the context is a generated list: the common words of a
// numbered word list (cwe), the frequent words of a coded text with Zipf counts (fwe).
#include <fmt/format.h>

#include <cmath>

#include "hyla/eval/longctx_task_parts.h"

namespace hyla {

LongCtxSample common_words_sample(const SampleRequest& request) {
  const std::string prefix =
      request.paraphrased
          ? "Here is a numbered list of words; some words occur more often than the rest. Remember which ones occur "
            "most.\n"
          : "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n";
  const std::string suffix =
      request.paraphrased
          ? "\nQuestion: Which 10 words occur most often in the list above? Answer: The 10 words that occur most often "
            "in the list are:"
          : "\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that appear "
            "most often in the list are:";
  const int64_t budget = list_budget(request, prefix, suffix, 0);
  const std::vector<std::string>& words = request.haystack.words();
  LongCtxSample sample;
  const std::vector<std::string> common = distinct(request.rng, words, 10);
  sample.expected = common;
  const auto items = fill_items(request.tokenizer, budget, [&](int64_t n) {
    // The 10 common words clearly outnumber every other: each other word appears f_u times and
    // each common word max(f_u·2, min(30, n/30)) times (RULER's 30 where the list is long enough).
    const int64_t others = int64_t(words.size()) - 10;
    int64_t f_common = std::max<int64_t>(2, std::min<int64_t>(30, n / 30));
    int64_t uncommon_items = std::max<int64_t>(0, n - 10 * f_common);
    const int64_t f_other = std::max<int64_t>(1, (uncommon_items + others - 1) / others);
    f_common = std::max(f_common, 2 * f_other);
    uncommon_items = std::max<int64_t>(0, n - 10 * f_common);
    std::vector<std::string> pool;
    Rng draw(request.rng);  // the same draws for every size tried
    for (const std::string& w : common)
      for (int64_t k = 0; k < f_common; ++k) pool.push_back(w);
    std::vector<std::string> others_order;
    for (const std::string& w : words)
      if (std::find(common.begin(), common.end(), w) == common.end()) others_order.push_back(w);
    for (size_t i = others_order.size(); i > 1; --i) std::swap(others_order[i - 1], others_order[draw.below(i)]);
    for (int64_t k = 0; k < uncommon_items / f_other; ++k)
      for (int64_t r = 0; r < f_other; ++r) pool.push_back(others_order[size_t(k)]);
    for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[draw.below(i)]);
    for (size_t i = 0; i < pool.size(); ++i) pool[i] = fmt::format("{}. {}", i + 1, pool[i]);
    return pool;
  });
  return list_sample(request, prefix, items, suffix, std::move(sample));
}

LongCtxSample frequent_words_sample(const SampleRequest& request) {
  const std::string prefix =
      request.paraphrased
          ? "Below is a text in code words. Count how often each code word occurs and find the three that occur "
            "most.\n"
          : "Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words.\n";
  const std::string suffix =
      request.paraphrased
          ? "\nQuestion: Which three code words occur most often in the coded text above? Answer: The three code "
            "words that occur most often in the coded text are:"
          : "\nQuestion: What are the three most frequently appeared words in the above coded text? Answer: "
            "According to the coded text above, the three most frequently appeared words are:";
  const int64_t budget = list_budget(request, prefix, suffix, 0);
  std::vector<std::string> coded;
  std::set<std::string> seen;
  while (coded.size() < 400) {
    std::string w;
    for (int i = 0; i < 4; ++i) w += char('a' + request.rng.below(26));
    if (seen.insert(w).second) coded.push_back(w);
  }
  LongCtxSample sample;
  sample.expected = {coded[0], coded[1], coded[2]};
  const auto items = fill_items(request.tokenizer, budget, [&](int64_t n) {
    // Zipf(2) counts, exactly: word r appears round(n·r^-2/ζ) times, then one each down the tail.
    std::vector<std::string> pool;
    for (size_t r = 0; r < coded.size() && int64_t(pool.size()) < n; ++r) {
      const int64_t count = std::max<int64_t>(1, std::llround(double(n) / (1.6449 * double((r + 1) * (r + 1)))));
      for (int64_t k = 0; k < count && int64_t(pool.size()) < n; ++k) pool.push_back(coded[r]);
    }
    Rng draw(request.rng);
    for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[draw.below(i)]);
    return pool;
  });
  HYLA_CHECK(items.size() >= 40, "fwe needs more than {} tokens (the three most frequent words must stand out)",
             request.length);
  return list_sample(request, prefix, items, suffix, std::move(sample));
}

}  // namespace hyla
