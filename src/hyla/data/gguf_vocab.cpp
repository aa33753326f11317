#include "hyla/data/gguf_vocab.h"

#include <array>
#include <utility>

#include "hyla/core/error.h"
#include "hyla/data/byte_level.h"
#include "hyla/data/tiktoken.h"

using json = nlohmann::json;

namespace hyla {
namespace {

enum TokenType : int { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

// llama.cpp's names for the pre-split patterns hyla implements.
const std::array<std::pair<std::string_view, std::string_view>, 3> kPreNames = {
    {{"qwen2", kDefaultPattern}, {"kimi-k2", kKimiPattern}, {"gpt-2", kGpt2Pattern}}};

}  // namespace

void add_gguf_tokenizer(const Tokenizer& tokenizer, int64_t vocab_size, GgufMetadata& metadata) {
  const TokenizerSpec& spec = tokenizer.spec();
  HYLA_CHECK(tokenizer.vocab_size() <= vocab_size, "tokenizer: {} tokens, more than the model's vocab_size {}",
             tokenizer.vocab_size(), vocab_size);
  const PreTokenizerConfig& pre = spec.pre_tokenizer;
  std::string pre_name;
  if (pre.splits.empty() && pre.use_regex && !pre.add_prefix_space) pre_name = "gpt-2";
  if (pre.splits.size() == 1 && !pre.splits[0].literal && !pre.use_regex && !pre.add_prefix_space)
    for (const auto& [name, pattern] : kPreNames)
      if (pre.splits[0].pattern == pattern) pre_name = name;
  HYLA_CHECK(!pre_name.empty(), "tokenizer: its pre-tokenizer has no llama.cpp name (hyla writes qwen2, kimi-k2 or gpt-2)");
  const size_t rows = static_cast<size_t>(vocab_size);
  std::vector<std::string> tokens(rows);
  std::vector<int> types(rows, kUnused);
  for (int64_t id = 0; id < vocab_size; ++id) tokens[size_t(id)] = fmt::format("[PAD{}]", id);
  for (const auto& [id, bytes] : spec.vocab) tokens[size_t(id)] = byte_level_encode(bytes), types[size_t(id)] = kNormal;
  for (const AddedToken& t : spec.added_tokens)
    tokens[size_t(t.id)] = t.content, types[size_t(t.id)] = t.special ? kControl : kUserDefined;
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) merges.push_back(tokens[size_t(a)] + " " + tokens[size_t(b)]);
  metadata["tokenizer.ggml.model"] = GgufValue::string("gpt2");
  metadata["tokenizer.ggml.pre"] = GgufValue::string(pre_name);
  metadata["tokenizer.ggml.tokens"] = GgufValue::of_array(GgufValueType::String, tokens);
  metadata["tokenizer.ggml.token_type"] = GgufValue::of_array(GgufValueType::I32, types);
  metadata["tokenizer.ggml.merges"] = GgufValue::of_array(GgufValueType::String, merges);
  if (const auto eos = tokenizer.token_id("<|endoftext|>"))
    metadata["tokenizer.ggml.eos_token_id"] = GgufValue::u32(uint32_t(*eos));
}

std::optional<Tokenizer> tokenizer_from_gguf(const GgufFile& g) {
  const std::string source = g.path().string();
  if (!g.has("tokenizer.ggml.model")) return std::nullopt;
  const std::string model = g.string("tokenizer.ggml.model");
  if (model == "none" || model == "no_vocab") return std::nullopt;
  HYLA_CHECK(model == "gpt2", "{}: tokenizer.ggml.model '{}'; hyla reads byte-level BPE ('gpt2') vocabularies", source,
             model);
  const std::string pre = g.has("tokenizer.ggml.pre") ? g.string("tokenizer.ggml.pre") : "gpt-2";
  TokenizerSpec spec;
  if (pre == "gpt-2" || pre == "default") {
    spec.pre_tokenizer.use_regex = true;
  } else {
    std::string_view pattern;
    for (const auto& [name, p] : kPreNames)
      if (name == pre) pattern = p;
    HYLA_CHECK(!pattern.empty(), "{}: tokenizer.ggml.pre '{}'; hyla implements qwen2, kimi-k2 and gpt-2", source, pre);
    spec.pre_tokenizer.splits.push_back({std::string(pattern), false});
  }
  spec.ignore_merges = pre == "kimi-k2";  // Kimi's tokenizer is tiktoken's: a piece that is a token stays whole
  const GgufValue& token_list = g.metadata().at("tokenizer.ggml.tokens");
  HYLA_CHECK(token_list.type == GgufValueType::Array && token_list.array.element() == GgufValueType::String,
             "{}: tokenizer.ggml.tokens is not an array of strings", source);
  const GgufArray& tokens = token_list.array;
  const std::vector<int64_t> types = g.has("tokenizer.ggml.token_type") ? g.integers("tokenizer.ggml.token_type")
                                                                        : std::vector<int64_t>(tokens.size(), kNormal);
  HYLA_CHECK(types.size() == tokens.size(), "{}: {} tokens but {} token types", source, tokens.size(), types.size());
  std::map<std::string, int32_t> id_of;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string text(tokens.string(id));
    if (types[id] == kUnused) continue;
    if (types[id] == kControl || types[id] == kUserDefined) {
      spec.added_tokens.push_back({int32_t(id), text, types[id] == kControl});
      continue;
    }
    const std::optional<std::string> bytes = byte_level_decode(text);
    HYLA_CHECK(bytes.has_value(), "{}: tokenizer.ggml.tokens[{}] '{}' is not a byte-level token", source, id, text);
    spec.vocab.emplace_back(int32_t(id), *bytes);
    id_of[text] = int32_t(id);
  }
  if (g.has("tokenizer.ggml.merges")) {
    const GgufValue& merges = g.metadata().at("tokenizer.ggml.merges");
    HYLA_CHECK(merges.type == GgufValueType::Array && merges.array.element() == GgufValueType::String,
               "{}: tokenizer.ggml.merges is not an array of strings", source);
    for (uint64_t i = 0; i < merges.array.size(); ++i) {
      const std::string text(merges.array.string(i));
      const size_t space = text.find(' ');
      HYLA_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos,
                 "{}: tokenizer.ggml.merges entry '{}' is not two tokens separated by one space", source, text);
      const auto l = id_of.find(text.substr(0, space)), r = id_of.find(text.substr(space + 1));
      HYLA_CHECK(l != id_of.end() && r != id_of.end(), "{}: tokenizer.ggml.merges entry '{}' names a token it lacks",
                 source, text);
      spec.merges.emplace_back(l->second, r->second);
    }
  }
  return Tokenizer(std::move(spec), source);
}

}  // namespace hyla
