#pragma once
// Grammar-constrained sampling: a context-free grammar over bytes and special tokens, and a
// matcher that follows every parse of the text so far at once (a set of stacks of grammar
// positions, the scheme of llama.cpp's grammars). Each step it flags the tokens whose bytes some
// parse can take next, so the sampler only ever draws text the grammar can complete.
//
// What crosses this seam: a Grammar (built by json_grammar.h, shared by the choices of a request),
// a GrammarVocabulary (a tokenizer's token bytes, built once), and per sequence a GrammarMatcher
// that fills an allowed-token mask and takes the drawn token. Rules must not be left-recursive;
// the builders make repetition right-recursive, which keeps the stacks as deep as the nesting.
#include <array>
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hyla {

class Tokenizer;

class Grammar {
 public:
  using Rule = int32_t;
  // One element of an alternative: a byte from a set, another rule, or one special token.
  struct Symbol {
    enum class Kind : uint8_t { Bytes, Ref, Special, End } kind;
    int32_t value;  // byte set index, rule, or token id
  };
  using Sequence = std::vector<Symbol>;

  Rule add_rule();  // a rule with no alternatives yet; the first is the start rule
  void add_alternative(Rule rule, const Sequence& sequence);  // an empty sequence matches nothing (ε)
  Symbol bytes(const std::bitset<256>& set);
  Symbol byte(uint8_t b);
  static Symbol ref(Rule rule) { return {Symbol::Kind::Ref, rule}; }
  static Symbol special(int32_t token) { return {Symbol::Kind::Special, token}; }
  Sequence literal(std::string_view text);  // its bytes, in order

  // Rules made of others: `symbol` between min and max times (max < 0: no bound), and "a or nothing".
  Rule repeat(Symbol symbol, int64_t min, int64_t max);
  Rule optional(const Sequence& sequence);

  int64_t rules() const { return int64_t(alternatives_.size()); }

 private:
  friend class GrammarMatcher;
  std::vector<Symbol> elements_;                   // every alternative's symbols, each ended by End
  std::vector<std::vector<int32_t>> alternatives_;  // per rule: where each alternative starts
  std::vector<std::bitset<256>> byte_sets_;
};

// A tokenizer's tokens as the matcher sees them: the bytes of every ordinary token, sorted so that
// tokens sharing a prefix are neighbours (the mask walks them as a trie), and the special tokens.
class GrammarVocabulary {
 public:
  explicit GrammarVocabulary(const Tokenizer& tokenizer);
  int64_t size() const { return vocab_; }

 private:
  friend class GrammarMatcher;
  struct Entry {
    int32_t token;
    int32_t shared;  // leading bytes in common with the previous entry
    std::string bytes;
  };
  int64_t vocab_ = 0;
  size_t longest_ = 0;
  std::vector<Entry> ordinary_;
  std::vector<int32_t> special_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(const Grammar& grammar);  // before any text; the grammar must outlive it
  // Flags [vocabulary.size()] which tokens some parse can take next (end tokens are the caller's:
  // see can_end()). Allocation-free once the caches have grown.
  void allowed(const GrammarVocabulary& vocabulary, uint8_t* allowed);
  // Takes a token's text (a special token by id); false, and no change, if no parse can.
  bool accept_bytes(std::string_view bytes);
  bool accept_special(int32_t token);
  bool can_end() const;       // some parse is complete
  bool can_continue() const;  // some parse can take more

 private:
  // Stacks of positions in Grammar::elements_, the innermost last, back to back.
  struct StackSet {
    std::vector<int32_t> positions;
    std::vector<size_t> ends;
    size_t size() const { return ends.size(); }
    size_t begin(size_t i) const { return i == 0 ? 0 : ends[i - 1]; }
    void clear() {
      positions.clear();
      ends.clear();
    }
    void add_unique(const std::vector<int32_t>& stack);
    bool operator==(const StackSet& other) const = default;
  };
  // The sets of parses met so far are interned as states, and their transitions on each byte
  // remembered: a lazily built DFA. Inside a string every character leads back to the same state,
  // so the mask's walk over the vocabulary is mostly table lookups.
  using State = int32_t;
  static constexpr State kDead = -1, kUnknown = -2;
  State intern(StackSet&& set);
  State step(State state, uint8_t byte);
  void forget_states_but_current();
  void close(std::vector<int32_t>& stack, StackSet& out, int depth) const;
  template <typename Takes>
  void advance(const StackSet& in, Takes takes, StackSet& out);
  void advance(const StackSet& in, uint8_t byte, StackSet& out);
  void advance_special(const StackSet& in, int32_t token, StackSet& out);

  const Grammar* grammar_;
  std::vector<StackSet> states_;
  std::vector<std::array<State, 256>> next_;       // per state and byte: kUnknown until computed
  std::unordered_multimap<uint64_t, State> index_;  // states by content hash
  State current_ = kDead;
  std::vector<State> levels_;  // the state after each byte of the token being checked
  StackSet scratch_;
  std::vector<int32_t> stack_;
};

}  // namespace hyla
