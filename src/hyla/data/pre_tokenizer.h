#pragma once
// Splits text into the pieces that BPE encodes independently, following an HF pre-tokenizer made of
// Split steps followed by ByteLevel.
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/regex.h"
#include "hyla/data/tokenizer_spec.h"

namespace hyla {

class PreTokenizer {
 public:
  PreTokenizer(const PreTokenizerConfig& config, const std::string& source);

  // Calls emit(piece) for each non-empty piece, in order; the pieces concatenate to `text` (plus
  // the prefix spaces that add_prefix_space inserts).
  template <typename Emit>
  void split(std::string_view text, RegexMatchData& scratch, Emit&& emit) const {
    split_from(0, text, scratch, emit);
  }

 private:
  template <typename Emit>
  void split_from(size_t step, std::string_view text, RegexMatchData& scratch, Emit& emit) const {
    if (text.empty()) return;
    if (step == prefix_step_ && add_prefix_space_ && text.front() != ' ') {
      std::string spaced;  // only tokenizers configured with add_prefix_space take this copy
      spaced.reserve(text.size() + 1);
      spaced += ' ';
      spaced += text;
      split_with_regex(step, spaced, scratch, emit);
    } else {
      split_with_regex(step, text, scratch, emit);
    }
  }

  template <typename Emit>
  void split_with_regex(size_t step, std::string_view text, RegexMatchData& scratch, Emit& emit) const {
    if (step == regexes_.size()) {
      emit(text);
      return;
    }
    size_t position = 0, begin = 0, end = 0;
    while (regexes_[step].find(text, position, scratch, begin, end)) {
      if (begin > position) split_from(step + 1, text.substr(position, begin - position), scratch, emit);
      split_from(step + 1, text.substr(begin, end - begin), scratch, emit);
      position = end;
    }
    if (position < text.size()) split_from(step + 1, text.substr(position), scratch, emit);
  }

  std::vector<Regex> regexes_;  // the Split steps, then GPT-2's regex if ByteLevel uses it
  size_t prefix_step_;          // where the ByteLevel step (and its prefix space) sits
  bool add_prefix_space_;
};

}  // namespace hyla
