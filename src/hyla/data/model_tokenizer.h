#pragma once
// The tokenizer of a model, wherever it keeps it: a model directory's tokenizer.json, a Kimi
// checkpoint's tiktoken.model (data/tiktoken.h), or a GGUF file's vocabulary (data/gguf_vocab.h).
#include <filesystem>
#include <optional>

#include "hyla/data/tokenizer.h"

namespace hyla {

// nullopt when the model has none (no tokenizer file; a GGUF without a vocabulary). A tokenizer
// with more ids than the model beside it has rows (config.json's vocab_size, a GGUF's
// token_embd) is an error: every command that reads a model's tokenizer refuses it alike.
std::optional<Tokenizer> find_model_tokenizer(const std::filesystem::path& path);
// The same, an error naming what is missing when there is none.
Tokenizer load_model_tokenizer(const std::filesystem::path& path);
// A `--tokenizer` argument: a tokenizer.json file, or a model (a directory, a Kimi checkpoint
// with its tiktoken.model, a GGUF) whose tokenizer to take.
Tokenizer load_tokenizer_argument(const std::filesystem::path& path);

}  // namespace hyla
