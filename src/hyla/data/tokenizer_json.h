#pragma once
// tokenizer.json in the HF `tokenizers` layout <-> TokenizerSpec. Reads byte-level BPE files as
// written by `tokenizers` (GPT-2 style: a ByteLevel pre-tokenizer with its regex; Qwen style: a
// Sequence of Split + ByteLevel; merges as "a b" strings or ["a", "b"] pairs). Anything that would
// change how text is encoded and that hyla does not implement is a hyla::Error naming the key.
#include <nlohmann/json.hpp>
#include <string>

#include "hyla/data/tokenizer_spec.h"

namespace hyla {

TokenizerSpec parse_tokenizer_json(const nlohmann::json& json, const std::string& source);
nlohmann::ordered_json tokenizer_json(const TokenizerSpec& spec);

}  // namespace hyla
