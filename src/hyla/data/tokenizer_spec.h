#pragma once
// The plain contents of a byte-level BPE tokenizer, as read from or written to tokenizer.json
// (HF `tokenizers` layout) and as produced by training. Tokenizer builds its lookup tables from it.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hyla {

// The special tokens of SPEC §8, in the order hyla's trainer gives them ids.
inline constexpr std::array<std::string_view, 10> kSpecialTokens = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",  "<|image_start|>", "<|image_end|>",
    "<|image_pad|>", "<tool_call>",  "</tool_call>", "<tool_response>", "</tool_response>"};

// The pre-tokenizer regex of the Qwen2 / GPT-4 family: contractions, letter runs with one leading
// non-letter, single digits, punctuation runs, newlines, other whitespace.
inline constexpr std::string_view kDefaultPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's regex, used by a ByteLevel pre-tokenizer with use_regex = true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A token matched in the text before pre-tokenisation (when the caller allows it).
struct AddedToken {
  int32_t id = 0;
  std::string content;  // raw text
  bool special = true;
  // Matching options of the HF layout; kept so a loaded file saves back unchanged, not applied.
  bool single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// An HF `Split` pre-tokenizer step with behaviour "Isolated": matches and the gaps between them
// each become a piece.
struct SplitRule {
  std::string pattern;
  bool literal = false;  // {"String": ...} rather than {"Regex": ...}
};

// Split steps in order, then the ByteLevel step (which may add a space in front of each piece and
// split with GPT-2's regex).
struct PreTokenizerConfig {
  std::vector<SplitRule> splits;
  bool add_prefix_space = false;
  bool use_regex = false;
  bool trim_offsets = false;  // affects offsets only; kept for saving
};

struct TokenizerSpec {
  std::vector<std::pair<int32_t, std::string>> vocab;  // model.vocab: id and raw bytes
  std::vector<std::pair<int32_t, int32_t>> merges;     // model.merges as token ids, rank order
  std::vector<AddedToken> added_tokens;
  PreTokenizerConfig pre_tokenizer;
  bool ignore_merges = false;  // a piece that is itself in the vocab becomes that one token
  bool nfc_normalizer = false;  // recorded and saved, not applied (docs/data.md)
};

}  // namespace hyla
