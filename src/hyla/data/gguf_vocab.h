#pragma once
// A byte-level BPE tokenizer as GGUF metadata, the way llama.cpp reads it (tokenizer.ggml.model
// "gpt2"): tokenizer.ggml.tokens (byte-level strings, data/byte_level.h; special tokens as their
// text), token_type (1 normal, 3 control for special tokens, 4 user-defined for other added ones,
// 5 unused for padding), merges ("a b"), and pre, the name of the pre-split pattern llama.cpp
// implements: "qwen2" (hyla's default pattern), "kimi-k2" (Kimi's) or "gpt-2".
#include <cstdint>
#include <optional>

#include "hyla/data/tokenizer.h"
#include "hyla/io/gguf.h"

namespace hyla {

// Adds the tokenizer's metadata, padded with unused "[PAD{id}]" tokens to `vocab_size` (the model's
// embedding rows). A pre-split pattern llama.cpp has no name for is an error.
void add_gguf_tokenizer(const Tokenizer& tokenizer, int64_t vocab_size, GgufMetadata& metadata);

// The tokenizer a GGUF file holds; nullopt when it has none (tokenizer.ggml.model "none"). Other
// tokenizer models and pre-split names hyla does not implement are errors naming them.
std::optional<Tokenizer> tokenizer_from_gguf(const GgufFile& gguf);

}  // namespace hyla
