#include "text_fixtures.h"

#include <array>
#include <string_view>

#include "hyla/core/random.h"
#include "hyla/data/bpe_trainer.h"

namespace hyla::test {

std::string sample_text(int paragraphs, uint64_t seed) {
  static constexpr std::array<std::string_view, 32> words = {
      "the",   "and",    "of",     "to",      "in",    "that",   "he",    "shall", "unto",  "for",  "I'll",
      "they",  "don't",  "LORD",   "city",    "water", "bread",  "house", "said",  "were",  "café", "naïve",
      "Zürich", "東京",  "river",  "mountain", "light", "earth",  "came",  "over",  "again", "new"};
  Rng rng(seed);
  std::string text;
  for (int p = 0; p < paragraphs; ++p) {
    const int sentences = 2 + int(rng.below(4));
    for (int s = 0; s < sentences; ++s) {
      const int length = 4 + int(rng.below(10));
      for (int w = 0; w < length; ++w) {
        std::string word(words[rng.below(words.size())]);
        if (w == 0) word[0] = char(std::toupper(uint8_t(word[0])));
        text += word;
        if (rng.below(9) == 0) text += ", " + std::to_string(rng.below(3000));
        text += w + 1 < length ? (rng.below(7) == 0 ? ", " : " ") : (rng.below(3) == 0 ? "!" : ".");
      }
      text += s + 1 < sentences ? (rng.below(2) ? " " : "\n") : "\n";
    }
    text += "\n";
  }
  return text;
}

const Tokenizer& small_tokenizer() {
  static const Tokenizer tokenizer = [] {
    const std::string text = sample_text();
    const std::string_view texts[] = {text};
    BpeTrainOptions options;
    options.vocab_size = 512;
    return Tokenizer(train_bpe(texts, options), "small tokenizer");
  }();
  return tokenizer;
}

Tokenizer kimi_tokenizer(bool k3) {
  static const std::vector<std::string> k2_markers = {
      "<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
      "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
  static const std::vector<std::string> k3_markers = {"<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"};
  TokenizerSpec spec = small_tokenizer().spec();
  int32_t id = small_tokenizer().vocab_size();
  for (const std::string& m : k2_markers) spec.added_tokens.push_back({id++, m});
  if (k3)
    for (const std::string& m : k3_markers) spec.added_tokens.push_back({id++, m});
  return Tokenizer(std::move(spec), k3 ? "kimi k3 markers" : "kimi k2 markers");
}

}  // namespace hyla::test
