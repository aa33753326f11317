// RULER's variable tracking: chains of "VAR X = VAR Y." at random places, in order, in noise; the
// answer is every variable that ends up holding the first chain's value.
#include <fmt/format.h>

#include <charconv>
#include <set>

#include "hyla/eval/longctx_task_parts.h"

namespace hyla {

bool parse_variable_tracking(const std::string& name, int& chains, int& hops) {
  if (name.rfind("vt_", 0) != 0) return false;
  const size_t x = name.find('x', 3);
  if (x == std::string::npos) return false;
  const char* end = name.data() + name.size();
  auto [p1, e1] = std::from_chars(name.data() + 3, name.data() + x, chains);
  auto [p2, e2] = std::from_chars(name.data() + x + 1, end, hops);
  return e1 == std::errc() && p1 == name.data() + x && e2 == std::errc() && p2 == end && chains >= 1 &&
         chains <= 4 && hops >= 1 && hops <= 16;
}

namespace {

std::string instruction(bool paraphrased) {
  return paraphrased ? "Follow the chains of variable assignments hidden in the text below and keep track of every "
                       "value.\n"
                     : "Memorize and track the chain(s) of variable assignment hidden in the following text.\n";
}

std::string question(bool paraphrased, const std::string& value, int hops) {
  return paraphrased ? fmt::format("\nQuestion: Which variables end up holding the value {} in the text above? Answer: "
                                   "Following the assignments in the text above, {} variables hold the value {}, "
                                   "they are:",
                                   value, hops + 1, value)
                     : fmt::format("\nQuestion: Find all variables that are assigned the value {} in the text above. "
                                   "Answer: According to the chain(s) of variable assignment in the text above, {} "
                                   "variables are assigned the value {}, they are:",
                                   value, hops + 1, value);
}

// `chain_count` chains of `hops` assignments after their value, interleaved (each in its own
// order); the variables are new to `names`. `expected`: the first chain's variables.
struct Chains {
  std::vector<std::string> sentences, expected;
  std::string value;  // the first chain's
};

Chains make_chains(Rng& rng, std::set<std::string>& names, int chain_count, int hops) {
  auto new_name = [&] {
    for (;;) {
      std::string n(5, 'A');
      for (char& c : n) c = char('A' + rng.below(26));
      if (names.insert(n).second) return n;
    }
  };
  Chains out;
  std::vector<std::vector<std::string>> chains(static_cast<size_t>(chain_count));
  std::vector<std::string> values;
  for (auto& chain : chains) {
    std::string value;
    do value = random_digits(rng, 5);
    while (std::find(values.begin(), values.end(), value) != values.end());
    values.push_back(value);
    std::string previous = new_name();
    chain.push_back(fmt::format("VAR {} = {}.", previous, value));
    if (&chain == &chains[0]) out.expected.push_back(previous);
    for (int h = 0; h < hops; ++h) {
      const std::string next = new_name();
      chain.push_back(fmt::format("VAR {} = VAR {}.", next, previous));
      if (&chain == &chains[0]) out.expected.push_back(next);
      previous = next;
    }
  }
  std::vector<size_t> taken(chains.size(), 0);
  for (size_t left = size_t(chain_count) * size_t(hops + 1); left > 0; --left) {
    size_t c = size_t(rng.below(chains.size()));
    while (taken[c] == chains[c].size()) c = (c + 1) % chains.size();
    out.sentences.push_back(chains[c][taken[c]++]);
  }
  out.value = values[0];
  return out;
}

}  // namespace

// RULER's one-shot form: after the instruction, a worked example (chains of the same shape, no
// noise, the question and its answer), then the task's context and question.
LongCtxSample variable_tracking_sample(const SampleRequest& request) {
  int chain_count = 0, hops = 0;
  const bool parsed = parse_variable_tracking(request.task.name, chain_count, hops);
  HYLA_ASSERT(parsed);
  std::set<std::string> names;
  const Chains example = make_chains(request.rng, names, chain_count, hops);
  const Chains task = make_chains(request.rng, names, chain_count, hops);
  std::string shown;
  for (const std::string& sentence : example.sentences) shown += " " + sentence;
  LongCtxSample worked;
  worked.expected = example.expected;
  Needles n;
  n.planted = task.sentences;
  n.expected = task.expected;
  n.placement = Placement::Spread;
  const bool p = request.paraphrased;
  n.prefix = fmt::format("{}{}{} {}\n", instruction(p), shown, question(p, example.value, hops), longctx_answer(worked));
  n.suffix = question(p, task.value, hops);
  return haystack_sample(request, Filler::Noise, n);
}

}  // namespace hyla
