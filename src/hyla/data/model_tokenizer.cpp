#include "hyla/data/model_tokenizer.h"

#include "hyla/core/error.h"
#include "hyla/data/gguf_vocab.h"
#include "hyla/data/tiktoken.h"

namespace fs = std::filesystem;

namespace hyla {

std::optional<Tokenizer> find_model_tokenizer(const fs::path& path) {
  if (fs::is_regular_file(path)) return tokenizer_from_gguf(GgufFile(path));
  if (fs::exists(path / "tokenizer.json")) return Tokenizer::load(path / "tokenizer.json");
  if (fs::exists(path / "tiktoken.model")) return load_kimi_tokenizer(path);
  return std::nullopt;
}

Tokenizer load_model_tokenizer(const fs::path& path) {
  std::optional<Tokenizer> t = find_model_tokenizer(path);
  HYLA_CHECK(t.has_value() || !fs::is_regular_file(path),
             "{}: the GGUF file has no vocabulary (tokenizer.ggml.model 'none'); give token ids", path.string());
  return t ? std::move(*t) : Tokenizer::load(path / "tokenizer.json");  // the error names the missing file
}

}  // namespace hyla
