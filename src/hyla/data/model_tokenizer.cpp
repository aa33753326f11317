#include "hyla/data/model_tokenizer.h"

#include "hyla/core/error.h"
#include "hyla/data/gguf_vocab.h"
#include "hyla/data/tiktoken.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/model_files.h"

namespace fs = std::filesystem;

namespace hyla {

std::optional<Tokenizer> find_model_tokenizer(const fs::path& path) {
  std::optional<Tokenizer> tokenizer;
  std::optional<int64_t> vocab;  // the model's, where the path holds one
  if (fs::is_regular_file(path)) {
    const GgufFile gguf(path);
    tokenizer = tokenizer_from_gguf(gguf);
    if (const GgufTensor* embeddings = gguf.find("token_embd.weight"); embeddings && embeddings->ne.size() == 2)
      vocab = embeddings->ne[1];
  } else {
    if (fs::exists(path / "tokenizer.json")) tokenizer = Tokenizer::load(path / "tokenizer.json");
    else if (fs::exists(path / "tiktoken.model")) tokenizer = load_kimi_tokenizer(path);
    if (tokenizer && fs::exists(path / "config.json")) vocab = model_config_of(path).vocab_size;
  }
  HYLA_CHECK(!tokenizer || !vocab || tokenizer->vocab_size() <= *vocab,
             "{}: the tokenizer has {} ids, more than the model's vocab_size {}", path.string(), tokenizer->vocab_size(),
             *vocab);
  return tokenizer;
}

Tokenizer load_model_tokenizer(const fs::path& path) {
  std::optional<Tokenizer> t = find_model_tokenizer(path);
  HYLA_CHECK(t.has_value() || !fs::is_regular_file(path),
             "{}: the GGUF file has no vocabulary (tokenizer.ggml.model 'none'); give token ids", path.string());
  return t ? std::move(*t) : Tokenizer::load(path / "tokenizer.json");  // the error names the missing file
}

Tokenizer load_tokenizer_argument(const fs::path& path) {
  if (fs::is_regular_file(path) && !is_gguf_file(path)) return Tokenizer::load(path);
  return load_model_tokenizer(path);
}

}  // namespace hyla
