// RULER's variable tracking: chains of "VAR X = VAR Y." in noise; the answer is every variable
// that ends up holding the first chain's value.
#include <fmt/format.h>

#include <charconv>

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

LongCtxSample variable_tracking_sample(const SampleRequest& request) {
  int chain_count = 0, hops = 0;
  const bool parsed = parse_variable_tracking(request.task.name, chain_count, hops);
  HYLA_ASSERT(parsed);
  Rng& rng = request.rng;
  std::set<std::string> names;
  auto new_name = [&] {
    for (;;) {
      std::string n(5, 'A');
      for (char& c : n) c = char('A' + rng.below(26));
      if (names.insert(n).second) return n;
    }
  };
  Needles n;
  std::vector<std::vector<std::string>> chains(static_cast<size_t>(chain_count));
  std::vector<std::string> values;
  for (auto& chain : chains) {
    std::string value;
    do value = random_digits(rng, 5);
    while (std::find(values.begin(), values.end(), value) != values.end());
    values.push_back(value);
    std::string previous = new_name();
    chain.push_back(fmt::format("VAR {} = {}.", previous, value));
    if (&chain == &chains[0]) n.expected.push_back(previous);
    for (int h = 0; h < hops; ++h) {
      const std::string next = new_name();
      chain.push_back(fmt::format("VAR {} = VAR {}.", next, previous));
      if (&chain == &chains[0]) n.expected.push_back(next);
      previous = next;
    }
  }
  // Interleave the chains, each in its own order.
  std::vector<size_t> taken(chains.size(), 0);
  for (size_t left = size_t(chain_count) * size_t(hops + 1); left > 0; --left) {
    size_t c = size_t(rng.below(chains.size()));
    while (taken[c] == chains[c].size()) c = (c + 1) % chains.size();
    n.planted.push_back(chains[c][taken[c]++]);
  }
  n.placement = Placement::InOrder;
  n.prefix = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n";
  n.suffix = fmt::format("\nQuestion: Find all variables that are assigned the value {} in the text above. Answer: "
                         "According to the chain(s) of variable assignment in the text above, {} variables are "
                         "assigned the value {}, they are:",
                         values[0], hops + 1, values[0]);
  return haystack_sample(request, Filler::Noise, n);
}

}  // namespace hyla
