#include "hyla/eval/longctx_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>
#include <span>

#include "hyla/core/error.h"
#include "hyla/core/random.h"

namespace hyla {
namespace {

// What a task's context is made of.
enum class Kind : uint8_t {
  Passkey, NiahNumber, NiahUuid, MultiKey, MultiValue, MultiQuery,  // needles in a haystack
  VariableTracking, Qa1, Qa2, Qa3,                                    // facts spread over a haystack
  CommonWords, FrequentWords, AssociativeRecall                       // the context is a generated list
};

enum class Source : uint8_t { Noise, Essay, None };

struct Spec {
  Kind kind;
  Source source;
  int chains = 0, hops = 0;  // variable tracking
};

// RULER's repeated-noise haystack: one unit, repeated.
constexpr std::string_view kNoise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

struct Named {
  const char* name;
  Spec spec;
  LongCtxTier tier;
  bool uses_depth;
  int64_t max_tokens;
  const char* what;
};

const std::array kTasks = {
    Named{"passkey", {Kind::Passkey, Source::Noise}, LongCtxTier::Retrieval, true, 16,
          "a 5-digit pass key in repeated noise"},
    Named{"niah_single_noise", {Kind::NiahNumber, Source::Noise}, LongCtxTier::Retrieval, true, 16,
          "word -> 7-digit number, one needle in repeated noise"},
    Named{"niah_single_essay", {Kind::NiahNumber, Source::Essay}, LongCtxTier::Retrieval, true, 16,
          "word -> 7-digit number, one needle in the essay haystack"},
    Named{"niah_single_uuid", {Kind::NiahUuid, Source::Essay}, LongCtxTier::Retrieval, true, 40,
          "word -> UUID-like key, one needle in the essay haystack"},
    Named{"niah_multikey", {Kind::MultiKey, Source::Essay}, LongCtxTier::Retrieval, true, 16,
          "the asked needle among 3 distractor needles with other keys"},
    Named{"niah_multivalue", {Kind::MultiValue, Source::Essay}, LongCtxTier::Retrieval, false, 48,
          "one key with 4 values, all expected"},
    Named{"niah_multiquery", {Kind::MultiQuery, Source::Essay}, LongCtxTier::Retrieval, false, 48,
          "4 keys asked at once, all values expected"},
    Named{"vt_1x4", {Kind::VariableTracking, Source::Noise, 1, 4}, LongCtxTier::Synthesis, false, 0,
          "variable tracking, 1 chain of 4 hops (vt_CxH: C chains of H hops, C 1-4, H 1-16)"},
    Named{"vt_2x8", {Kind::VariableTracking, Source::Noise, 2, 8}, LongCtxTier::Synthesis, false, 0,
          "variable tracking, 2 chains of 8 hops"},
    Named{"cwe", {Kind::CommonWords, Source::None}, LongCtxTier::Synthesis, false, 64,
          "the 10 most common words of a numbered list"},
    Named{"fwe", {Kind::FrequentWords, Source::None}, LongCtxTier::Synthesis, false, 24,
          "the 3 most frequent coded words of a Zipf-distributed text"},
    Named{"qa1", {Kind::Qa1, Source::Essay}, LongCtxTier::Synthesis, false, 12,
          "bAbI QA1: where is a person (one supporting fact among 8)"},
    Named{"qa2", {Kind::Qa2, Source::Essay}, LongCtxTier::Synthesis, false, 12,
          "bAbI QA2: where is an object (who carries it, and where they went)"},
    Named{"qa3", {Kind::Qa3, Source::Essay}, LongCtxTier::Synthesis, false, 12,
          "bAbI QA3: where was an object before a place (its path)"},
    Named{"mqar", {Kind::AssociativeRecall, Source::None}, LongCtxTier::Synthesis, false, 32,
          "multi-query associative recall: the values of 4 keys among key-value pairs filling the context"},
};

// vt_CxH beyond the two listed.
bool parse_vt(const std::string& name, int& chains, int& hops) {
  if (name.rfind("vt_", 0) != 0) return false;
  const size_t x = name.find('x', 3);
  if (x == std::string::npos) return false;
  const char* end = name.data() + name.size();
  auto [p1, e1] = std::from_chars(name.data() + 3, name.data() + x, chains);
  auto [p2, e2] = std::from_chars(name.data() + x + 1, end, hops);
  return e1 == std::errc() && p1 == name.data() + x && e2 == std::errc() && p2 == end && chains >= 1 &&
         chains <= 4 && hops >= 1 && hops <= 16;
}

Spec spec_of(const std::string& name) {
  for (const Named& t : kTasks)
    if (name == t.name) return t.spec;
  int chains = 0, hops = 0;
  if (parse_vt(name, chains, hops)) return {Kind::VariableTracking, Source::Noise, chains, hops};
  fail("unknown long-context task '{}'; known: {}", name, describe_longctx_tasks());
}

// ---- assembling a prompt ----------------------------------------------------------------------

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

std::string random_digits(Rng& rng, int digits) {
  std::string s(size_t(digits), '0');
  s[0] = char('1' + rng.below(9));
  for (int i = 1; i < digits; ++i) s[size_t(i)] = char('0' + rng.below(10));
  return s;
}

std::string random_uuid(Rng& rng) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (int group : {8, 4, 4, 4, 12}) {
    if (!s.empty()) s += '-';
    for (int i = 0; i < group; ++i) s += kHex[rng.below(16)];
  }
  return s;
}

// `n` distinct picks from `pool`.
std::vector<std::string> distinct(Rng& rng, const std::vector<std::string>& pool, size_t n) {
  HYLA_ASSERT(n <= pool.size());
  std::set<size_t> chosen;
  std::vector<std::string> out;
  while (out.size() < n) {
    const size_t i = size_t(rng.below(pool.size()));
    if (chosen.insert(i).second) out.push_back(pool[i]);
  }
  return out;
}

// `count` random positions in [0, n], sorted (several may coincide).
std::vector<size_t> spread_positions(Rng& rng, size_t n, size_t count) {
  std::vector<size_t> at(count);
  for (size_t& p : at) p = size_t(rng.below(n + 1));
  std::sort(at.begin(), at.end());
  return at;
}

// ---- bAbI-style stories ---------------------------------------------------------------------

constexpr std::array kPeople = {"Mary", "John", "Daniel", "Sandra", "Fred", "Julie", "Bill", "Emily"};
constexpr std::array kPlaces = {"kitchen", "garden", "bathroom", "bedroom", "office", "hallway", "cellar", "balcony"};
constexpr std::array kObjects = {"football", "apple", "milk", "book", "lamp", "key"};
constexpr std::array kMoves = {"went to", "moved to", "journeyed to", "travelled to"};
constexpr std::array kTakes = {"picked up", "got", "grabbed"};
constexpr std::array kDrops = {"dropped", "discarded", "put down"};

struct Story {
  std::vector<std::string> facts;
  std::string question, answer;
};

// QA1: where is a person. The asked person moves at least twice; the answer is the last move.
Story qa1_story(Rng& rng) {
  for (;;) {
    Story s;
    std::array<int, kPeople.size()> at;
    at.fill(-1);
    std::array<int, kPeople.size()> moves{};
    for (int f = 0; f < 8; ++f) {
      const size_t who = size_t(rng.below(4));
      int where = int(rng.below(kPlaces.size()));
      if (where == at[who]) where = (where + 1) % int(kPlaces.size());
      at[who] = where;
      ++moves[who];
      s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kMoves[rng.below(kMoves.size())], kPlaces[size_t(where)]));
    }
    std::vector<size_t> askable;
    for (size_t p = 0; p < 4; ++p)
      if (moves[p] >= 2) askable.push_back(p);
    if (askable.empty()) continue;
    const size_t who = askable[rng.below(askable.size())];
    s.question = fmt::format("Where is {}?", kPeople[who]);
    s.answer = kPlaces[size_t(at[who])];
    return s;
  }
}

// QA2 and QA3 share one simulation: people move, objects are picked up and dropped; a held
// object is wherever its holder is. Every person moves before taking anything, so every place is known.
struct World {
  std::array<int, kPeople.size()> person_at;
  std::array<int, kObjects.size()> holder, object_at;
  std::array<std::vector<int>, kObjects.size()> path;  // each object's distinct consecutive places
  World() {
    person_at.fill(-1);
    holder.fill(-1);
    object_at.fill(-1);
  }
  void place_object(size_t o, int where) {
    object_at[o] = where;
    if (path[o].empty() || path[o].back() != where) path[o].push_back(where);
  }
};

Story object_story(Rng& rng, bool before, int events) {
  for (;;) {
    Story s;
    World w;
    constexpr size_t people = 4, objects = 3;
    for (int e = 0; e < events; ++e) {
      const size_t who = size_t(rng.below(people));
      const uint64_t roll = rng.below(10);
      size_t held = objects;
      for (size_t o = 0; o < objects; ++o)
        if (w.holder[o] == int(who)) held = o;
      if (w.person_at[who] < 0 || roll < 5) {  // move (and carry what is held)
        int where = int(rng.below(kPlaces.size()));
        if (where == w.person_at[who]) where = (where + 1) % int(kPlaces.size());
        w.person_at[who] = where;
        if (held < objects) w.place_object(held, where);
        s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kMoves[rng.below(kMoves.size())], kPlaces[size_t(where)]));
      } else if (held < objects) {  // drop
        w.holder[held] = -1;
        s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kDrops[rng.below(kDrops.size())], kObjects[held]));
      } else {  // take a free object, which is now where its taker is
        const size_t o = size_t(rng.below(objects));
        if (w.holder[o] >= 0) continue;
        w.holder[o] = int(who);
        w.place_object(o, w.person_at[who]);
        s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kTakes[rng.below(kTakes.size())], kObjects[o]));
      }
    }
    std::vector<size_t> askable;
    for (size_t o = 0; o < objects; ++o)
      if (before ? w.path[o].size() >= 2 : w.object_at[o] >= 0) askable.push_back(o);
    if (askable.empty()) continue;
    const size_t o = askable[rng.below(askable.size())];
    if (!before) {
      s.question = fmt::format("Where is the {}?", kObjects[o]);
      s.answer = kPlaces[size_t(w.object_at[o])];
      return s;
    }
    // A place the object reached once only, so "before" names one place.
    std::vector<size_t> steps;
    for (size_t k = 1; k < w.path[o].size(); ++k)
      if (std::count(w.path[o].begin(), w.path[o].end(), w.path[o][k]) == 1) steps.push_back(k);
    if (steps.empty()) continue;
    const size_t k = steps[rng.below(steps.size())];
    s.question = fmt::format("Where was the {} before the {}?", kObjects[o], kPlaces[size_t(w.path[o][k])]);
    s.answer = kPlaces[size_t(w.path[o][k - 1])];
    return s;
  }
}

// ---- generated lists (the context itself) -----------------------------------------------------

// Items whose count is chosen so that their tokens fill `budget`: `make(n)` builds n items; the
// count is estimated from a probe and shrunk until the items fit.
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

}  // namespace

const char* to_string(LongCtxTier tier) { return tier == LongCtxTier::Retrieval ? "retrieval" : "synthesis"; }

LongCtxTask longctx_task(const std::string& name) {
  for (const Named& t : kTasks)
    if (name == t.name) return {name, t.tier, t.uses_depth, t.max_tokens ? t.max_tokens : 10 + 6 * (t.spec.hops + 1)};
  const Spec spec = spec_of(name);
  return {name, LongCtxTier::Synthesis, false, 10 + 6 * (spec.hops + 1)};
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

LongCtxSample make_longctx_sample(const LongCtxTask& task, const Haystack& haystack, const Tokenizer& tokenizer,
                                  int64_t length, double depth, uint64_t seed, uint64_t index, bool no_context) {
  const Spec spec = spec_of(task.name);
  HYLA_CHECK(!task.uses_depth || (depth >= 0 && depth <= 1), "depth {} is outside [0, 1]", depth);
  Rng rng(hash_string(fmt::format("{}|{}|{}|{}|{:.6f}|{}", kLongCtxGenerator, seed, task.name, length,
                                  task.uses_depth ? depth : -1.0, index)));
  LongCtxSample sample;
  sample.depth = task.uses_depth ? depth : -1;
  std::string prefix, suffix;
  std::vector<std::string> planted;  // in the order they appear
  bool planted_at_depth = false;     // planted[0] at `depth`, the others at random places
  bool planted_in_order = false;     // facts spread evenly, in order
  std::vector<std::string> items;    // list tasks: the context is these (no haystack)
  const std::vector<std::string>& words = haystack.words();
  auto number_needle = [&](const std::string& key, const std::string& value, const char* what) {
    return fmt::format("One of the special magic {} for {} is: {}.", what, key, value);
  };
  const char* niah_prefix =
      "Some special magic {} are hidden within the following text. Make sure to memorize it. I will quiz you about "
      "the {} afterwards.\n";

  switch (spec.kind) {
    case Kind::Passkey: {
      const std::string key = random_digits(rng, 5);
      prefix = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will "
               "quiz you about the important information there.\n";
      planted = {fmt::format("The pass key is {}. Remember it. {} is the pass key.", key, key)};
      planted_at_depth = true;
      suffix = "\nWhat is the pass key? The pass key is";
      sample.expected = {key};
      break;
    }
    case Kind::NiahNumber:
    case Kind::NiahUuid:
    case Kind::MultiKey: {
      const bool uuid = spec.kind == Kind::NiahUuid;
      const char* what = uuid ? "uuids" : "numbers";
      const std::vector<std::string> keys = distinct(rng, words, spec.kind == Kind::MultiKey ? 4 : 1);
      for (const std::string& key : keys) {
        const std::string value = uuid ? random_uuid(rng) : random_digits(rng, 7);
        if (sample.expected.empty()) sample.expected = {value};
        planted.push_back(number_needle(key, value, what));
      }
      planted_at_depth = true;
      prefix = fmt::format(fmt::runtime(niah_prefix), what, what);
      suffix = fmt::format("\nWhat is the special magic {} for {} mentioned in the provided text? The special magic {} "
                           "for {} mentioned in the provided text is",
                           uuid ? "uuid" : "number", keys[0], uuid ? "uuid" : "number", keys[0]);
      break;
    }
    case Kind::MultiValue: {
      const std::string key = distinct(rng, words, 1)[0];
      for (int v = 0; v < 4; ++v) {
        sample.expected.push_back(random_digits(rng, 7));
        planted.push_back(number_needle(key, sample.expected.back(), "numbers"));
      }
      prefix = fmt::format(fmt::runtime(niah_prefix), "numbers", "numbers");
      suffix = fmt::format("\nWhat are all the special magic numbers for {} mentioned in the provided text? The special "
                           "magic numbers for {} mentioned in the provided text are",
                           key, key);
      break;
    }
    case Kind::MultiQuery: {
      const std::vector<std::string> keys = distinct(rng, words, 4);
      for (const std::string& key : keys) {
        sample.expected.push_back(random_digits(rng, 7));
        planted.push_back(number_needle(key, sample.expected.back(), "numbers"));
      }
      prefix = fmt::format(fmt::runtime(niah_prefix), "numbers", "numbers");
      const std::string list = fmt::format("{}, {}, {}, and {}", keys[0], keys[1], keys[2], keys[3]);
      suffix = fmt::format("\nWhat are all the special magic numbers for {} mentioned in the provided text? The special "
                           "magic numbers for {} mentioned in the provided text are",
                           list, list);
      break;
    }
    case Kind::VariableTracking: {
      std::set<std::string> names;
      auto new_name = [&] {
        for (;;) {
          std::string n(5, 'A');
          for (char& c : n) c = char('A' + rng.below(26));
          if (names.insert(n).second) return n;
        }
      };
      std::vector<std::vector<std::string>> chains(size_t(spec.chains));
      std::vector<std::string> values;
      for (auto& chain : chains) {
        std::string value;
        do value = random_digits(rng, 5);
        while (std::find(values.begin(), values.end(), value) != values.end());
        values.push_back(value);
        std::string previous = new_name();
        chain.push_back(fmt::format("VAR {} = {}.", previous, value));
        if (&chain == &chains[0]) sample.expected.push_back(previous);
        for (int h = 0; h < spec.hops; ++h) {
          const std::string next = new_name();
          chain.push_back(fmt::format("VAR {} = VAR {}.", next, previous));
          if (&chain == &chains[0]) sample.expected.push_back(next);
          previous = next;
        }
      }
      // Interleave the chains, each in its own order.
      std::vector<size_t> taken(chains.size(), 0);
      for (size_t left = size_t(spec.chains) * size_t(spec.hops + 1); left > 0; --left) {
        size_t c = size_t(rng.below(chains.size()));
        while (taken[c] == chains[c].size()) c = (c + 1) % chains.size();
        planted.push_back(chains[c][taken[c]++]);
      }
      planted_in_order = true;
      prefix = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n";
      suffix = fmt::format("\nQuestion: Find all variables that are assigned the value {} in the text above. Answer: "
                           "According to the chain(s) of variable assignment in the text above, {} variables are "
                           "assigned the value {}, they are:",
                           values[0], spec.hops + 1, values[0]);
      break;
    }
    case Kind::Qa1:
    case Kind::Qa2:
    case Kind::Qa3: {
      const Story story = spec.kind == Kind::Qa1 ? qa1_story(rng) : object_story(rng, spec.kind == Kind::Qa3, 14);
      planted = story.facts;
      planted_in_order = true;
      prefix = "Answer the question from the story told in the following text. Only give the answer.\n";
      suffix = fmt::format("\nQuestion: {} Answer: the", story.question);
      sample.expected = {story.answer};
      break;
    }
    case Kind::CommonWords:
      prefix = "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
               "ones that appear most often.\n";
      suffix = "\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that appear "
               "most often in the list are:";
      break;
    case Kind::FrequentWords:
      prefix = "Read the following coded text and track the frequency of each coded word. Find the three most "
               "frequently appeared coded words.\n";
      suffix = "\nQuestion: What are the three most frequently appeared words in the above coded text? Answer: "
               "According to the coded text above, the three most frequently appeared words are:";
      break;
    case Kind::AssociativeRecall:
      prefix = "Remember the number that follows each key.\n";
      break;
  }

  const int64_t fixed = int64_t(tokenizer.encode(prefix).size()) + task.max_tokens;
  // The list tasks decide their answers while filling the context.
  Context context;  // views into the haystack, `noise` and `list`
  std::vector<std::vector<int32_t>> list;
  const std::vector<int32_t> noise =
      spec.source == Source::Noise ? tokenizer.encode(" " + std::string(kNoise)) : std::vector<int32_t>();
  if (spec.source == Source::None) {
    const int64_t query_reserve = spec.kind == Kind::AssociativeRecall ? 64 : 0;  // its question names the keys drawn
    const int64_t budget = length - fixed - int64_t(tokenizer.encode(suffix).size()) - query_reserve - 16;
    HYLA_CHECK(budget > 16, "{} needs more than {} tokens", task.name, length);
    if (spec.kind == Kind::CommonWords) {
      const std::vector<std::string> common = distinct(rng, words, 10);
      sample.expected = common;
      list = fill_items(tokenizer, budget, [&](int64_t n) {
        // The 10 common words clearly outnumber every other: each other word appears f_u times and
        // each common word max(f_u·2, min(30, n/30)) times (RULER's 30 where the list is long enough).
        const int64_t others = int64_t(words.size()) - 10;
        int64_t f_common = std::max<int64_t>(2, std::min<int64_t>(30, n / 30));
        int64_t uncommon_items = std::max<int64_t>(0, n - 10 * f_common);
        const int64_t f_other = std::max<int64_t>(1, (uncommon_items + others - 1) / others);
        f_common = std::max(f_common, 2 * f_other);
        uncommon_items = std::max<int64_t>(0, n - 10 * f_common);
        std::vector<std::string> pool;
        Rng draw(rng);  // the same draws for every size tried
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
    } else if (spec.kind == Kind::FrequentWords) {
      std::vector<std::string> coded;
      std::set<std::string> seen;
      while (coded.size() < 400) {
        std::string w;
        for (int i = 0; i < 4; ++i) w += char('a' + rng.below(26));
        if (seen.insert(w).second) coded.push_back(w);
      }
      sample.expected = {coded[0], coded[1], coded[2]};
      list = fill_items(tokenizer, budget, [&](int64_t n) {
        // Zipf(2) counts, exactly: word r appears round(n·r^-2/ζ) times, then one each down the tail.
        std::vector<std::string> pool;
        for (size_t r = 0; r < coded.size() && int64_t(pool.size()) < n; ++r) {
          const int64_t count = std::max<int64_t>(1, std::llround(double(n) / (1.6449 * double((r + 1) * (r + 1)))));
          for (int64_t k = 0; k < count && int64_t(pool.size()) < n; ++k) pool.push_back(coded[r]);
        }
        Rng draw(rng);
        for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[draw.below(i)]);
        return pool;
      });
      HYLA_CHECK(list.size() >= 40, "fwe needs more than {} tokens (the three most frequent words must stand out)", length);
    } else {
      std::vector<std::pair<std::string, std::string>> pairs;
      std::set<std::string> keys;
      list = fill_items(tokenizer, budget, [&](int64_t n) {
        HYLA_CHECK(uint64_t(n) <= uint64_t(words.size()) * words.size() / 2,
                   "mqar at {} tokens needs more distinct keys than the haystack's {} words make", length, words.size());
        Rng draw(rng);
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
      HYLA_CHECK(list.size() >= 4, "mqar needs more than {} tokens", length);
      std::vector<size_t> asked;
      while (asked.size() < 4) {
        const size_t i = size_t(rng.below(list.size()));
        if (std::find(asked.begin(), asked.end(), i) == asked.end()) asked.push_back(i);
      }
      std::string query;
      for (size_t i : asked) {
        query += fmt::format("{}{}", query.empty() ? "" : ", ", pairs[i].first);
        sample.expected.push_back(pairs[i].second);
        sample.inserted.push_back(fmt::format("{} {}.", pairs[i].first, pairs[i].second));
      }
      suffix = fmt::format("\nQuestion: What numbers follow {}? Answer: The numbers are", query);
    }
    if (!no_context)
      for (const auto& ids : list) context.filler.emplace_back(ids);
  } else {
    sample.inserted = planted;
    std::vector<std::vector<int32_t>> planted_ids;
    int64_t planted_tokens = 0;
    for (const std::string& p : planted) {
      planted_ids.push_back(tokenizer.encode(" " + p));
      planted_tokens += int64_t(planted_ids.back().size());
    }
    // 16 tokens spare: the last piece is tokenised again with the question (assemble).
    const int64_t budget = length - fixed - int64_t(tokenizer.encode(suffix).size()) - planted_tokens - 16;
    HYLA_CHECK(budget >= 0, "{} needs at least {} tokens, more than the length {}", task.name, length - budget, length);
    if (!no_context) {
      int64_t used = 0;
      int64_t next = int64_t(rng.below(uint64_t(haystack.sentences())));
      for (;;) {
        std::span<const int32_t> piece = spec.source == Source::Noise
                                             ? std::span<const int32_t>(noise)
                                             : std::span<const int32_t>(&*haystack.begin(next), size_t(haystack.tokens(next)));
        if (used + int64_t(piece.size()) > budget) break;
        context.filler.push_back(piece);
        used += int64_t(piece.size());
        ++next;
      }
      const size_t n = context.filler.size();
      std::vector<size_t> at;
      if (planted_at_depth) {
        at = {size_t(std::llround(depth * double(n)))};
        for (size_t i = 1; i < planted_ids.size(); ++i) at.push_back(size_t(rng.below(n + 1)));
      } else if (planted_in_order) {
        for (size_t i = 0; i < planted_ids.size(); ++i)
          at.push_back(size_t(std::llround(double(i + 1) * double(n) / double(planted_ids.size() + 1))));
      } else {
        at = spread_positions(rng, n, planted_ids.size());
      }
      for (size_t i = 0; i < planted_ids.size(); ++i) context.planted.emplace_back(at[i], std::move(planted_ids[i]));
      std::stable_sort(context.planted.begin(), context.planted.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
  }
  sample.prompt = assemble(tokenizer, prefix, context, suffix);
  HYLA_ASSERT(int64_t(sample.prompt.size()) + task.max_tokens <= length);
  return sample;
}

}  // namespace hyla
