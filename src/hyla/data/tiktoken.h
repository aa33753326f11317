#pragma once
// tiktoken BPE files (one "base64(bytes) rank" line per token, ranks 0 … n−1: Kimi K3's and Kimi
// Linear's tiktoken.model) as hyla tokenizers. tiktoken takes a pre-split piece whole when it is a
// token, else merges the adjacent pair whose concatenation has the lowest rank; hyla's BPE applies
// merges in list order. The merge list built here gives each token of two or more bytes the pair
// that tiktoken's own merging of its bytes (with the lower ranks only) ends with, in rank order, as
// the HF and llama.cpp converters do: the two encoders then agree except where a token's bytes are
// also reachable through another split, which vocabularies trained by BPE do not produce.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/tokenizer.h"
#include "hyla/data/tokenizer_spec.h"

namespace hyla {

// Kimi's pre-split pattern (tokenization_kimi.py), its character-class intersections `[X&&[^\p{Han}]]`
// written as `(?:(?!\p{Han})[X])` for PCRE2.
inline constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The tokens of a tiktoken file with the merges that reproduce its encoding and a pre-split
// pattern (special tokens are the caller's: ids after the ranks). Errors name `source` and the line.
TokenizerSpec tokenizer_spec_from_tiktoken(std::string_view ranks, std::string_view pattern, const std::string& source);

// A Kimi checkpoint's tokenizer: `dir`/tiktoken.model with the special tokens of
// `dir`/tokenizer_config.json's added_tokens_decoder, the ids it leaves among the 256 reserved
// after the ranks named <|reserved_token_{id}|> as tokenization_kimi.py names them.
Tokenizer load_kimi_tokenizer(const std::filesystem::path& dir);

}  // namespace hyla
