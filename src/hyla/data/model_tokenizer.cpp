#include "hyla/data/model_tokenizer.h"

#include "hyla/core/error.h"
#include "hyla/data/gguf_vocab.h"
#include "hyla/data/tiktoken.h"

namespace fs = std::filesystem;

namespace hyla {

Tokenizer load_model_tokenizer(const fs::path& path) {
  if (fs::is_regular_file(path)) {
    std::optional<Tokenizer> t = tokenizer_from_gguf(GgufFile(path));
    HYLA_CHECK(t.has_value(), "{}: the GGUF file has no vocabulary (tokenizer.ggml.model 'none'); give token ids",
               path.string());
    return std::move(*t);
  }
  const fs::path json = path / "tokenizer.json";
  if (fs::exists(json) || !fs::exists(path / "tiktoken.model")) return Tokenizer::load(json);
  return load_kimi_tokenizer(path);
}

}  // namespace hyla
