#include "hyla/infer/grammar.h"

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/data/tokenizer.h"

namespace hyla {

namespace {
// A text nesting deeper than this (arrays in arrays ...) is refused rather than followed.
constexpr size_t kMaxStackDepth = 512;
// Parses followed at once; only overlapping alternatives (anyOf) multiply them.
constexpr size_t kMaxParses = 4096;
// Expansions in one closure: only a left-recursive or ε-cyclic grammar comes near (the builders make none).
constexpr int kMaxExpansionDepth = 4 * int(kMaxStackDepth) + 64;
// States remembered per matcher (a 1 KiB transition row each) before all but the current are dropped.
constexpr size_t kMaxStates = 4096;

uint64_t hash_of(const std::vector<int32_t>& positions, const std::vector<size_t>& ends) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over both arrays
  const auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (const int32_t p : positions) mix(uint64_t(uint32_t(p)));
  for (const size_t e : ends) mix(uint64_t(e) << 32);
  return h;
}
}  // namespace

Grammar::Rule Grammar::add_rule() {
  alternatives_.emplace_back();
  return Rule(alternatives_.size() - 1);
}

void Grammar::add_alternative(Rule rule, const Sequence& sequence) {
  HYLA_ASSERT(rule >= 0 && rule < rules());
  alternatives_[size_t(rule)].push_back(int32_t(elements_.size()));
  elements_.insert(elements_.end(), sequence.begin(), sequence.end());
  elements_.push_back({Symbol::Kind::End, 0});
}

Grammar::Symbol Grammar::bytes(const std::bitset<256>& set) {
  const auto it = std::find(byte_sets_.begin(), byte_sets_.end(), set);
  if (it != byte_sets_.end()) return {Symbol::Kind::Bytes, int32_t(it - byte_sets_.begin())};
  byte_sets_.push_back(set);
  return {Symbol::Kind::Bytes, int32_t(byte_sets_.size() - 1)};
}

Grammar::Symbol Grammar::byte(uint8_t b) {
  std::bitset<256> set;
  set.set(b);
  return bytes(set);
}

Grammar::Sequence Grammar::literal(std::string_view text) {
  Sequence sequence;
  for (const char c : text) sequence.push_back(byte(uint8_t(c)));
  return sequence;
}

Grammar::Rule Grammar::repeat(Symbol symbol, int64_t min, int64_t max) {
  HYLA_ASSERT(min >= 0 && (max < 0 || max >= min));
  Rule tail = add_rule();
  if (max < 0) {
    add_alternative(tail, {symbol, ref(tail)});
    add_alternative(tail, {});
  } else {
    // tail_k: up to k more; tail_0 is ε.
    add_alternative(tail, {});
    for (int64_t k = 1; k <= max - min; ++k) {
      const Rule next = add_rule();
      add_alternative(next, {symbol, ref(tail)});
      add_alternative(next, {});
      tail = next;
    }
  }
  const Rule rule = add_rule();
  Sequence sequence(size_t(min), symbol);
  sequence.push_back(ref(tail));
  add_alternative(rule, sequence);
  return rule;
}

Grammar::Rule Grammar::optional(const Sequence& sequence) {
  const Rule rule = add_rule();
  add_alternative(rule, sequence);
  add_alternative(rule, {});
  return rule;
}

GrammarVocabulary::GrammarVocabulary(const Tokenizer& tokenizer) : vocab_(tokenizer.vocab_size()) {
  for (int32_t id = 0; id < int32_t(vocab_); ++id) {
    if (tokenizer.is_special(id)) {
      special_.push_back(id);
      continue;
    }
    const std::string_view bytes = tokenizer.decode_token(id);
    if (!bytes.empty()) ordinary_.push_back({id, 0, std::string(bytes)});
  }
  std::sort(ordinary_.begin(), ordinary_.end(), [](const Entry& a, const Entry& b) { return a.bytes < b.bytes; });
  for (size_t i = 0; i < ordinary_.size(); ++i) {
    longest_ = std::max(longest_, ordinary_[i].bytes.size());
    if (i == 0) continue;
    const std::string &a = ordinary_[i - 1].bytes, &b = ordinary_[i].bytes;
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    ordinary_[i].shared = int32_t(n);
  }
}

void GrammarMatcher::StackSet::add_unique(const std::vector<int32_t>& stack) {
  for (size_t i = 0; i < size(); ++i)
    if (ends[i] - begin(i) == stack.size() && std::equal(stack.begin(), stack.end(), positions.begin() + int64_t(begin(i))))
      return;
  HYLA_CHECK(size() < kMaxParses,
             "grammar: more than {} parses of the output at once (a schema whose anyOf alternatives overlap?)", kMaxParses);
  positions.insert(positions.end(), stack.begin(), stack.end());
  ends.push_back(positions.size());
}

GrammarMatcher::GrammarMatcher(const Grammar& grammar) : grammar_(&grammar) {
  HYLA_ASSERT(grammar.rules() > 0);
  StackSet start;
  for (const int32_t first : grammar.alternatives_[0]) {
    stack_.assign(1, first);
    close(stack_, start, 0);
  }
  current_ = intern(std::move(start));
}

GrammarMatcher::State GrammarMatcher::intern(StackSet&& set) {
  const uint64_t h = hash_of(set.positions, set.ends);
  for (auto [it, end] = index_.equal_range(h); it != end; ++it)
    if (states_[size_t(it->second)] == set) return it->second;
  states_.push_back(std::move(set));
  std::array<State, 256> unknown;
  unknown.fill(kUnknown);
  next_.push_back(unknown);
  index_.emplace(h, State(states_.size() - 1));
  return State(states_.size() - 1);
}

GrammarMatcher::State GrammarMatcher::step(State state, uint8_t byte) {
  State& next = next_[size_t(state)][byte];
  if (next != kUnknown) return next;
  advance(states_[size_t(state)], byte, scratch_);
  // intern() may grow next_, so the row is looked up again after it.
  const State found = scratch_.size() == 0 ? kDead : intern(StackSet(scratch_));
  next_[size_t(state)][byte] = found;
  return found;
}

void GrammarMatcher::forget_states_but_current() {
  StackSet keep = std::move(states_[size_t(current_)]);
  states_.clear();
  next_.clear();
  index_.clear();
  current_ = intern(std::move(keep));
}

// Expands `stack` until its innermost position is a terminal (or the parse is complete), adding
// every resulting stack to `out`. `stack` is restored before returning.
void GrammarMatcher::close(std::vector<int32_t>& stack, StackSet& out, int depth) const {
  HYLA_ASSERT(depth < kMaxExpansionDepth);
  if (stack.empty()) {
    out.add_unique(stack);
    return;
  }
  const int32_t p = stack.back();
  const Grammar::Symbol symbol = grammar_->elements_[size_t(p)];
  using Kind = Grammar::Symbol::Kind;
  switch (symbol.kind) {
    case Kind::Bytes:
    case Kind::Special:
      out.add_unique(stack);
      return;
    case Kind::End:
      stack.pop_back();
      close(stack, out, depth + 1);
      stack.push_back(p);
      return;
    case Kind::Ref: {
      // A reference last in its alternative leaves nothing to come back to: dropping it keeps
      // right recursion (repetition) from deepening the stack.
      const bool last = grammar_->elements_[size_t(p) + 1].kind == Kind::End;
      if (last) stack.pop_back();
      else stack.back() = p + 1;
      HYLA_CHECK(stack.size() < kMaxStackDepth, "grammar: the output nests more than {} levels deep", kMaxStackDepth);
      for (const int32_t start : grammar_->alternatives_[size_t(symbol.value)]) {
        stack.push_back(start);
        close(stack, out, depth + 1);
        stack.pop_back();
      }
      if (last) stack.push_back(p);
      else stack.back() = p;
      return;
    }
  }
}

// Every parse whose next terminal `takes` goes one past it; `out` gets the closed results.
template <typename Takes>
void GrammarMatcher::advance(const StackSet& in, Takes takes, StackSet& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in.ends[i] == in.begin(i)) continue;  // complete: takes nothing more
    const int32_t top = in.positions[in.ends[i] - 1];
    if (!takes(grammar_->elements_[size_t(top)])) continue;
    stack_.assign(in.positions.begin() + int64_t(in.begin(i)), in.positions.begin() + int64_t(in.ends[i]));
    stack_.back() = top + 1;
    close(stack_, out, 0);
  }
}

void GrammarMatcher::advance(const StackSet& in, uint8_t byte, StackSet& out) {
  advance(in, [&](const Grammar::Symbol& s) {
    return s.kind == Grammar::Symbol::Kind::Bytes && grammar_->byte_sets_[size_t(s.value)].test(byte);
  }, out);
}

void GrammarMatcher::advance_special(const StackSet& in, int32_t token, StackSet& out) {
  advance(in, [&](const Grammar::Symbol& s) { return s.kind == Grammar::Symbol::Kind::Special && s.value == token; }, out);
}

void GrammarMatcher::allowed(const GrammarVocabulary& vocabulary, uint8_t* allowed) {
  if (states_.size() > kMaxStates) forget_states_but_current();
  std::fill(allowed, allowed + vocabulary.vocab_, uint8_t(0));
  if (levels_.size() < vocabulary.longest_ + 1) levels_.resize(vocabulary.longest_ + 1);
  levels_[0] = current_;
  // Tokens in byte order share prefixes with their neighbours: levels_[k] is the state after the
  // first k bytes of the last token walked, valid for its first `valid` bytes; a prefix no parse
  // takes (at `dead`) rules out every following token that starts with it.
  size_t valid = 0, dead = SIZE_MAX;
  for (const GrammarVocabulary::Entry& e : vocabulary.ordinary_) {
    valid = std::min(valid, size_t(e.shared));
    if (dead <= valid) continue;
    dead = SIZE_MAX;
    for (; valid < e.bytes.size(); ++valid) {
      levels_[valid + 1] = step(levels_[valid], uint8_t(e.bytes[valid]));
      if (levels_[valid + 1] == kDead) {
        dead = ++valid;
        break;
      }
    }
    if (dead == SIZE_MAX) allowed[e.token] = 1;
  }
  const StackSet& now = states_[size_t(current_)];
  for (size_t i = 0; i < now.size(); ++i) {
    if (now.ends[i] == now.begin(i)) continue;
    const Grammar::Symbol symbol = grammar_->elements_[size_t(now.positions[now.ends[i] - 1])];
    if (symbol.kind == Grammar::Symbol::Kind::Special && symbol.value < vocabulary.vocab_) allowed[symbol.value] = 1;
  }
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  State state = current_;
  for (const char c : bytes)
    if ((state = step(state, uint8_t(c))) == kDead) return false;
  current_ = state;
  return true;
}

bool GrammarMatcher::accept_special(int32_t token) {
  advance_special(states_[size_t(current_)], token, scratch_);
  if (scratch_.size() == 0) return false;
  current_ = intern(StackSet(scratch_));
  return true;
}

bool GrammarMatcher::can_end() const {
  const StackSet& now = states_[size_t(current_)];
  for (size_t i = 0; i < now.size(); ++i)
    if (now.ends[i] == now.begin(i)) return true;
  return false;
}

bool GrammarMatcher::can_continue() const {
  const StackSet& now = states_[size_t(current_)];
  for (size_t i = 0; i < now.size(); ++i)
    if (now.ends[i] != now.begin(i)) return true;
  return false;
}

}  // namespace hyla
