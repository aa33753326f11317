#pragma once
// Byte-level BPE training. Pieces (pre-tokenised words) are counted once and deduplicated; pair
// counts are updated incrementally per merge for the words that contain the merged pair only; the
// next merge comes from a priority queue whose stale entries are skipped lazily.
//
// Tie-breaking (deterministic): the pair with the highest count wins; among equal counts, the pair
// whose left token's bytes are lexicographically smallest (unsigned bytes), then whose right
// token's bytes are. Results do not depend on the thread count.
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/tokenizer_spec.h"

namespace hyla {

struct BpeTrainOptions {
  int32_t vocab_size = 8192;  // byte tokens + merged tokens + special tokens
  std::vector<std::string> special_tokens{kSpecialTokens.begin(), kSpecialTokens.end()};
  std::string pattern{kDefaultPattern};
  bool show_progress = false;
};

// Trains on texts (special tokens found in them are skipped, not learnt). Ids: the 256 byte tokens
// in GPT-2's order, then merged tokens in the order they were made, then the special tokens. If
// the texts run out of pairs first, the vocabulary is smaller than asked.
TokenizerSpec train_bpe(std::span<const std::string_view> texts, const BpeTrainOptions& options);

// Trains on files; an empty file, or one with a NUL byte (binary, not text), is a hyla::Error.
TokenizerSpec train_bpe_files(std::span<const std::filesystem::path> files, const BpeTrainOptions& options);

}  // namespace hyla
