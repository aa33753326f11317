// Multi-query associative recall (Zoology, Arora et al., 2023): key-number pairs fill the context
// and the question asks for the numbers of 4 of the keys, an architecture check for small models.
#include <fmt/format.h>

#include "hyla/eval/longctx_task_parts.h"

namespace hyla {

LongCtxSample associative_recall_sample(const SampleRequest& request) {
  const std::string prefix = "Remember the number that follows each key.\n";
  // The question names the keys drawn, so it is written after the list: its room is reserved.
  const int64_t budget = list_budget(request, prefix, "", 64);
  const std::vector<std::string>& words = request.haystack.words();
  std::vector<std::pair<std::string, std::string>> pairs;
  std::set<std::string> keys;
  const auto items = fill_items(request.tokenizer, budget, [&](int64_t n) {
    HYLA_CHECK(uint64_t(n) <= uint64_t(words.size()) * words.size() / 2,
               "mqar at {} tokens needs more distinct keys than the haystack's {} words make", request.length,
               words.size());
    Rng draw(request.rng);
    pairs.clear();
    keys.clear();
    while (int64_t(pairs.size()) < n) {
      std::string key = words[draw.below(words.size())] + "-" + words[draw.below(words.size())];
      if (keys.insert(key).second) pairs.emplace_back(std::move(key), random_digits(draw, 4));
    }
    std::vector<std::string> out;
    for (const auto& [k, v] : pairs) out.push_back(fmt::format("{} {}.", k, v));
    return out;
  });
  HYLA_CHECK(items.size() >= 4, "mqar needs more than {} tokens", request.length);
  std::vector<size_t> asked;
  while (asked.size() < 4) {
    const size_t i = size_t(request.rng.below(items.size()));
    if (std::find(asked.begin(), asked.end(), i) == asked.end()) asked.push_back(i);
  }
  LongCtxSample sample;
  std::string query;
  for (size_t i : asked) {
    query += fmt::format("{}{}", query.empty() ? "" : ", ", pairs[i].first);
    sample.expected.push_back(pairs[i].second);
    sample.inserted.push_back(fmt::format("{} {}.", pairs[i].first, pairs[i].second));
  }
  const std::string suffix = fmt::format("\nQuestion: What numbers follow {}? Answer: The numbers are", query);
  return list_sample(request, prefix, items, suffix, std::move(sample));
}

}  // namespace hyla
