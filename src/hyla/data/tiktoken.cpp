#include "hyla/data/tiktoken.h"

#include <charconv>
#include <map>
#include <unordered_map>

#include "hyla/core/error.h"
#include "hyla/io/base64.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"

namespace fs = std::filesystem;

namespace hyla {
namespace {

constexpr int32_t kKimiReservedTokens = 256;

// tiktoken's merging of `bytes` with the ranks below `limit`: the parts it ends with.
std::vector<std::string_view> merge_parts(std::string_view bytes, int32_t limit,
                                          const std::unordered_map<std::string_view, int32_t>& rank) {
  std::vector<std::string_view> parts;
  for (size_t i = 0; i < bytes.size(); ++i) parts.push_back(bytes.substr(i, 1));
  while (parts.size() > 1) {
    int32_t best = limit;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const std::string_view joined(parts[i].data(), parts[i].size() + parts[i + 1].size());
      const auto it = rank.find(joined);
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == limit) break;
    parts[at] = std::string_view(parts[at].data(), parts[at].size() + parts[at + 1].size());
    parts.erase(parts.begin() + std::ptrdiff_t(at) + 1);
  }
  return parts;
}

}  // namespace

TokenizerSpec tokenizer_spec_from_tiktoken(std::string_view ranks, std::string_view pattern, const std::string& source) {
  TokenizerSpec spec;
  size_t line_start = 0;
  int64_t line = 0;
  while (line_start < ranks.size()) {
    size_t end = ranks.find('\n', line_start);
    if (end == std::string_view::npos) end = ranks.size();
    std::string_view text = ranks.substr(line_start, end - line_start);
    line_start = end + 1;
    ++line;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.empty()) continue;
    const size_t space = text.find(' ');
    HYLA_CHECK(space != std::string_view::npos, "{}:{}: expected 'base64 rank', got '{}'", source, line,
               text.substr(0, 60));
    const std::vector<uint8_t> bytes = base64_decode(text.substr(0, space), fmt::format("{}:{}", source, line));
    HYLA_CHECK(!bytes.empty(), "{}:{}: an empty token", source, line);
    const std::string_view number = text.substr(space + 1);
    int32_t rank = -1;
    const auto [ptr, error] = std::from_chars(number.data(), number.data() + number.size(), rank);
    HYLA_CHECK(error == std::errc() && ptr == number.data() + number.size() && rank == int32_t(spec.vocab.size()),
               "{}:{}: rank '{}' where {} comes next (ranks run 0, 1, 2, … in order)", source, line, number,
               spec.vocab.size());
    spec.vocab.emplace_back(rank, std::string(bytes.begin(), bytes.end()));
  }
  HYLA_CHECK(!spec.vocab.empty(), "{}: no tokens", source);
  std::unordered_map<std::string_view, int32_t> rank;
  for (const auto& [id, bytes] : spec.vocab) {
    const bool inserted = rank.emplace(bytes, id).second;
    HYLA_CHECK(inserted, "{}: token {} repeats the bytes of an earlier one", source, id);
  }
  for (int b = 0; b < 256; ++b) {
    const char byte = char(b);
    HYLA_CHECK(rank.count(std::string_view(&byte, 1)), "{}: no token for the byte 0x{:02x}", source, b);
  }
  for (const auto& [id, bytes] : spec.vocab) {
    if (bytes.size() < 2) continue;
    const std::vector<std::string_view> parts = merge_parts(bytes, id, rank);
    HYLA_CHECK(parts.size() == 2,
               "{}: token {} cannot be built by merging two lower-ranked tokens (its bytes merge into {} parts)", source,
               id, parts.size());
    spec.merges.emplace_back(rank.at(parts[0]), rank.at(parts[1]));
  }
  spec.pre_tokenizer.splits.push_back({std::string(pattern), false});
  spec.ignore_merges = true;  // tiktoken looks a whole piece up before merging
  return spec;
}

Tokenizer load_kimi_tokenizer(const fs::path& dir) {
  const fs::path ranks_path = dir / "tiktoken.model", config_path = dir / "tokenizer_config.json";
  TokenizerSpec spec = tokenizer_spec_from_tiktoken(read_file(ranks_path), kKimiPattern, ranks_path.string());
  const int32_t base = int32_t(spec.vocab.size());
  std::map<int32_t, AddedToken> specials;
  if (fs::exists(config_path)) {
    const nlohmann::json config = parse_json_file(config_path.string());
    const nlohmann::json decoder = config.is_object() ? config.value("added_tokens_decoder", nlohmann::json::object())
                                                      : nlohmann::json();
    HYLA_CHECK(decoder.is_object(), "{}: added_tokens_decoder is not an object", config_path.string());
    for (const auto& [key, token] : decoder.items()) {
      int32_t id = -1;
      const auto [ptr, error] = std::from_chars(key.data(), key.data() + key.size(), id);
      HYLA_CHECK(error == std::errc() && ptr == key.data() + key.size() && id >= base && token.is_object() &&
                     token.contains("content") && token["content"].is_string(),
                 "{}: added_tokens_decoder['{}'] is not a token with an id after the {} ranks and a content",
                 config_path.string(), key, base);
      AddedToken t;
      t.id = id;
      t.content = token["content"].get<std::string>();
      t.special = !token.contains("special") || token["special"] == true;
      specials[id] = t;
    }
  }
  for (int32_t id = base; id < base + kKimiReservedTokens; ++id)
    if (!specials.count(id)) specials[id] = AddedToken{id, fmt::format("<|reserved_token_{}|>", id)};
  for (auto& [id, t] : specials) spec.added_tokens.push_back(std::move(t));
  return Tokenizer(std::move(spec), ranks_path.string());
}

}  // namespace hyla
