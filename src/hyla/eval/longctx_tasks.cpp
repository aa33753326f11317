#include "hyla/eval/longctx_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <set>
#include <span>

#include "hyla/eval/longctx_task_parts.h"

namespace hyla {
namespace {

struct Named {
  const char* name;
  LongCtxTier tier;
  bool uses_depth;
  int64_t max_tokens;  // variable tracking's grows with its hops: longctx_task
  const char* what;
  LongCtxSample (*make)(const SampleRequest& request);
};

const std::array kTasks = {
    Named{"passkey", LongCtxTier::Retrieval, true, 16, "a 5-digit pass key in repeated noise", passkey_sample},
    Named{"niah_single_noise", LongCtxTier::Retrieval, true, 16, "word -> 7-digit number, one needle in repeated noise",
          [](const SampleRequest& r) { return single_needle_sample(r, Filler::Noise, NeedleValue::Number, 1); }},
    Named{"niah_single_essay", LongCtxTier::Retrieval, true, 16,
          "word -> 7-digit number, one needle in the essay haystack",
          [](const SampleRequest& r) { return single_needle_sample(r, Filler::Essay, NeedleValue::Number, 1); }},
    Named{"niah_single_uuid", LongCtxTier::Retrieval, true, 40, "word -> UUID-like key, one needle in the essay haystack",
          [](const SampleRequest& r) { return single_needle_sample(r, Filler::Essay, NeedleValue::Uuid, 1); }},
    Named{"niah_multikey", LongCtxTier::Retrieval, true, 16, "the asked needle among 3 distractor needles with other keys",
          [](const SampleRequest& r) { return single_needle_sample(r, Filler::Essay, NeedleValue::Number, 4); }},
    Named{"niah_multikey_2", LongCtxTier::Retrieval, true, 16,
          "word -> 7-digit number in a haystack made of such needles for other words",
          [](const SampleRequest& r) { return needle_haystack_sample(r, NeedleValue::Number); }},
    Named{"niah_multikey_3", LongCtxTier::Retrieval, true, 40,
          "UUID -> UUID in a haystack made of such needles for other UUIDs",
          [](const SampleRequest& r) { return needle_haystack_sample(r, NeedleValue::Uuid); }},
    Named{"niah_multivalue", LongCtxTier::Retrieval, false, 48, "one key with 4 values, all expected",
          multivalue_sample},
    Named{"niah_multiquery", LongCtxTier::Retrieval, false, 48, "4 keys asked at once, all values expected",
          multiquery_sample},
    Named{"vt_1x4", LongCtxTier::Synthesis, false, 0,
          "variable tracking, 1 chain of 4 hops (vt_CxH: C chains of H hops, C 1-4, H 1-16)",
          variable_tracking_sample},
    Named{"vt_2x8", LongCtxTier::Synthesis, false, 0, "variable tracking, 2 chains of 8 hops",
          variable_tracking_sample},
    Named{"cwe", LongCtxTier::Synthesis, false, 64, "the 10 most common words of a numbered list", common_words_sample},
    Named{"fwe", LongCtxTier::Synthesis, false, 24, "the 3 most frequent coded words of a Zipf-distributed text",
          frequent_words_sample},
    Named{"qa1", LongCtxTier::Synthesis, false, 12, "bAbI QA1: where is a person (one supporting fact among 8)",
          [](const SampleRequest& r) { return babi_sample(r, 1); }},
    Named{"qa2", LongCtxTier::Synthesis, false, 12,
          "bAbI QA2: where is an object (who carries it, and where they went)",
          [](const SampleRequest& r) { return babi_sample(r, 2); }},
    Named{"qa3", LongCtxTier::Synthesis, false, 12, "bAbI QA3: where was an object before a place (its path)",
          [](const SampleRequest& r) { return babi_sample(r, 3); }},
    Named{"mqar", LongCtxTier::Synthesis, false, 56,
          "multi-query associative recall: one-token key-value pairs fill the context (noise after 256 of them); 16 "
          "keys asked, each answered with its value and scored",
          associative_recall_sample},
};

// The listed task of that name; an unknown name is an error listing the known ones.
const Named& listed(const std::string& name) {
  for (const Named& t : kTasks)
    if (name == t.name) return t;
  fail("unknown long-context task '{}'; known: {}", name, describe_longctx_tasks());
}

bool is_variable_tracking(const std::string& name) {
  int chains = 0, hops = 0;
  return parse_variable_tracking(name, chains, hops);
}

// The context as planted sentences (owned ids) placed among haystack sentences (views).
struct Context {
  std::vector<std::span<const int32_t>> filler;  // in order
  std::vector<std::pair<size_t, std::vector<int32_t>>> planted;  // (before filler[i], ids), sorted by i, stable
};

// The question is tokenised together with the piece before it: a tokenizer's pre-split may join
// punctuation with the newline that follows ("again.\nWhat" is not "again." + "\nWhat").
std::vector<int32_t> assemble(const Tokenizer& tokenizer, std::string_view prefix, const Context& context,
                              std::string_view suffix) {
  std::vector<int32_t> ids = tokenizer.encode(prefix);
  size_t last = 0;  // where the last piece starts
  auto add = [&](std::span<const int32_t> piece) {
    last = ids.size();
    ids.insert(ids.end(), piece.begin(), piece.end());
  };
  size_t next = 0;
  for (size_t i = 0; i <= context.filler.size(); ++i) {
    for (; next < context.planted.size() && context.planted[next].first == i; ++next) add(context.planted[next].second);
    if (i < context.filler.size()) add(context.filler[i]);
  }
  const std::string tail = tokenizer.decode(std::span<const int32_t>(ids).subspan(last)) + std::string(suffix);
  ids.resize(last);
  tokenizer.encode_append(tail, false, ids);
  return ids;
}

// Where each of `count` planted sentences goes: before which of `n` filler sentences (n: after the last).
std::vector<size_t> positions(const SampleRequest& request, Placement placement, size_t n, size_t count) {
  std::vector<size_t> at;
  switch (placement) {
    case Placement::AtDepth:
      at = {size_t(std::llround(request.depth * double(n)))};
      for (size_t i = 1; i < count; ++i) at.push_back(size_t(request.rng.below(n + 1)));
      break;
    case Placement::Spread:  // several may share a place
      at.resize(count);
      for (size_t& p : at) p = size_t(request.rng.below(n + 1));
      std::sort(at.begin(), at.end());
      break;
  }
  return at;
}

// The instruction's tokens and the answer's budget: what every prompt of the task spends besides its context.
int64_t fixed_tokens(const SampleRequest& request, std::string_view prefix) {
  return int64_t(request.tokenizer.encode(prefix).size()) + request.task.max_tokens;
}

LongCtxSample with_prompt(const SampleRequest& request, std::string_view prefix, const Context& context,
                     std::string_view suffix, LongCtxSample sample) {
  sample.prompt = assemble(request.tokenizer, prefix, context, suffix);
  HYLA_ASSERT(int64_t(sample.prompt.size()) + request.task.max_tokens <= request.length);
  return sample;
}

}  // namespace

const char* to_string(LongCtxTier tier) { return tier == LongCtxTier::Retrieval ? "retrieval" : "synthesis"; }

const char* to_string(LongCtxWording wording) { return wording == LongCtxWording::Ruler ? "ruler" : "paraphrased"; }

LongCtxTask longctx_task(const std::string& name) {
  int chains = 0, hops = 0;
  if (parse_variable_tracking(name, chains, hops)) return {name, LongCtxTier::Synthesis, false, 10 + 6 * (hops + 1)};
  const Named& t = listed(name);
  return {name, t.tier, t.uses_depth, t.max_tokens};
}

std::vector<std::string> default_longctx_tasks() {
  std::vector<std::string> names;
  for (const Named& t : kTasks) names.push_back(t.name);
  return names;
}

std::string describe_longctx_tasks() {
  std::string out;
  for (const Named& t : kTasks) out += fmt::format("{}{} ({})", out.empty() ? "" : ", ", t.name, t.what);
  return out;
}

Haystack::Haystack(std::string_view text, const Tokenizer& tokenizer) {
  std::set<std::string> words;
  offsets_.push_back(0);
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
    if (line.empty()) continue;
    tokenizer.encode_append(" " + std::string(line), false, ids_);
    offsets_.push_back(int64_t(ids_.size()));
    std::string word;
    for (size_t i = 0; i <= line.size(); ++i) {
      const char c = i < line.size() ? line[i] : ' ';
      if (std::isalpha(static_cast<unsigned char>(c))) {
        word += char(std::tolower(static_cast<unsigned char>(c)));
        continue;
      }
      if (word.size() >= 3 && word.size() <= 10) words.insert(word);
      word.clear();
    }
  }
  HYLA_CHECK(sentences() > 0, "the haystack text has no sentences (no non-empty lines)");
  HYLA_CHECK(words.size() >= 64, "the haystack text has {} distinct words of 3-10 letters; the tasks need at least 64",
             words.size());
  words_.assign(words.begin(), words.end());
  std::vector<std::pair<size_t, std::string>> by_tokens;
  for (const std::string& w : words_) by_tokens.emplace_back(tokenizer.encode(" " + w).size(), w);
  std::sort(by_tokens.begin(), by_tokens.end());
  for (size_t i = 0; i < std::min<size_t>(by_tokens.size(), 1024); ++i) short_words_.push_back(by_tokens[i].second);
}

std::vector<int32_t>::const_iterator Haystack::begin(int64_t i) const {
  return ids_.begin() + offsets_[size_t(i % sentences())];
}
std::vector<int32_t>::const_iterator Haystack::end(int64_t i) const {
  return ids_.begin() + offsets_[size_t(i % sentences()) + 1];
}
int64_t Haystack::tokens(int64_t i) const { return int64_t(end(i) - begin(i)); }

std::string longctx_answer(const LongCtxSample& sample) {
  std::string answer;
  for (const std::string& e : sample.expected) answer += (answer.empty() ? " " : ", ") + e;
  return answer + ".";
}

double share_found(std::string_view output, const std::vector<std::string>& expected) {
  if (expected.empty()) return 0.0;
  auto lower = [](std::string_view s) {
    std::string out(s);
    for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  const std::string text = lower(output);
  int64_t found = 0;
  for (const std::string& e : expected) found += text.find(lower(e)) != std::string::npos;
  return double(found) / double(expected.size());
}

LongCtxSample haystack_sample(const SampleRequest& request, Filler filler, const Needles& needles) {
  const Tokenizer& tokenizer = request.tokenizer;
  LongCtxSample sample;
  sample.expected = needles.expected;
  sample.inserted = needles.planted;
  std::vector<std::vector<int32_t>> planted_ids;
  int64_t planted_tokens = 0;
  for (const std::string& p : needles.planted) {
    planted_ids.push_back(tokenizer.encode(" " + p));
    planted_tokens += int64_t(planted_ids.back().size());
  }
  // 16 tokens spare: the last piece is tokenised again with the question (assemble).
  const int64_t budget = request.length - fixed_tokens(request, needles.prefix) -
                         int64_t(tokenizer.encode(needles.suffix).size()) - planted_tokens - 16;
  if (budget < 0)
    throw LongCtxDoesNotFit(fmt::format("{} needs at least {} tokens, more than the length {}", request.task.name,
                                        request.length - budget, request.length));
  Context context;  // views into the haystack, `noise` and `generated`
  const std::vector<int32_t> noise =
      filler == Filler::Noise ? tokenizer.encode(" " + std::string(kNoise)) : std::vector<int32_t>();
  std::vector<std::vector<int32_t>> generated;  // each inner buffer stays put as the outer one grows
  HYLA_ASSERT(filler != Filler::Generated || needles.filler_sentence);
  if (!request.no_context) {
    const Haystack& haystack = request.haystack;
    int64_t used = 0;
    int64_t next = int64_t(request.rng.below(uint64_t(haystack.sentences())));
    for (;;) {
      std::span<const int32_t> piece;
      if (filler == Filler::Noise) piece = noise;
      else if (filler == Filler::Essay) piece = std::span<const int32_t>(&*haystack.begin(next), size_t(haystack.tokens(next)));
      else piece = generated.emplace_back(tokenizer.encode(" " + needles.filler_sentence()));
      if (used + int64_t(piece.size()) > budget) break;
      context.filler.push_back(piece);
      used += int64_t(piece.size());
      ++next;
    }
    const std::vector<size_t> at = positions(request, needles.placement, context.filler.size(), planted_ids.size());
    for (size_t i = 0; i < planted_ids.size(); ++i) context.planted.emplace_back(at[i], std::move(planted_ids[i]));
    std::stable_sort(context.planted.begin(), context.planted.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  return with_prompt(request, needles.prefix, context, needles.suffix, std::move(sample));
}

int64_t list_budget(const SampleRequest& request, std::string_view prefix, std::string_view suffix, int64_t reserve) {
  const int64_t budget = request.length - fixed_tokens(request, prefix) -
                         int64_t(request.tokenizer.encode(suffix).size()) - reserve - 16;
  if (budget <= 16)
    throw LongCtxDoesNotFit(fmt::format("{} needs more than {} tokens", request.task.name, request.length));
  return budget;
}

LongCtxSample list_sample(const SampleRequest& request, std::string_view prefix,
                          const std::vector<std::vector<int32_t>>& items, std::string_view suffix, LongCtxSample sample) {
  Context context;  // views into `items`
  if (!request.no_context)
    for (const auto& ids : items) context.filler.emplace_back(ids);
  return with_prompt(request, prefix, context, suffix, std::move(sample));
}

LongCtxSample make_longctx_sample(const LongCtxTask& task, const Haystack& haystack, const Tokenizer& tokenizer,
                                  int64_t length, double depth, uint64_t seed, uint64_t index, bool no_context,
                                  LongCtxWording wording) {
  const auto make = is_variable_tracking(task.name) ? variable_tracking_sample : listed(task.name).make;
  HYLA_CHECK(!task.uses_depth || (depth >= 0 && depth <= 1), "depth {} is outside [0, 1]", depth);
  Rng rng(hash_string(fmt::format("{}|{}|{}|{}|{:.6f}|{}", kLongCtxGenerator, seed, task.name, length,
                                  task.uses_depth ? depth : -1.0, index)));
  LongCtxSample sample = make({task, haystack, tokenizer, length, depth, no_context, wording == LongCtxWording::Paraphrased, rng});
  sample.depth = task.uses_depth ? depth : -1;
  return sample;
}

}  // namespace hyla
