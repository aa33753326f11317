#pragma once
// The tokenizer of a model, wherever it keeps it: a model directory's tokenizer.json, a Kimi
// checkpoint's tiktoken.model (data/tiktoken.h), or a GGUF file's vocabulary (data/gguf_vocab.h).
#include <filesystem>

#include "hyla/data/tokenizer.h"

namespace hyla {

Tokenizer load_model_tokenizer(const std::filesystem::path& path);

}  // namespace hyla
