#pragma once
// Byte-level BPE tokenizer in the HF `tokenizers` file layout. Encoding is lossless for every byte
// string (invalid UTF-8 included): decode(encode(x)) == x, given a vocabulary with all 256 byte
// tokens (hyla's trainer always has them; a file without some cannot encode those bytes: an
// error). Encoding and decoding are thread-safe; copies share the same immutable tables.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/tokenizer_spec.h"

namespace hyla {

class Tokenizer {
 public:
  // Validates the spec (ids unique and non-negative, merges whose parts and result are in the
  // vocab); `source` names the origin in error messages.
  Tokenizer(TokenizerSpec spec, const std::string& source);

  static Tokenizer load(const std::filesystem::path& path);
  static Tokenizer from_json(const nlohmann::json& json, const std::string& source);
  void save(const std::filesystem::path& path) const;  // atomic
  nlohmann::ordered_json to_json() const;

  // With allow_special, added tokens (e.g. "<|endoftext|>") found in the text become their ids
  // (longest match first); without, such text is encoded as ordinary bytes.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  void encode_append(std::string_view text, bool allow_special, std::vector<int32_t>& out) const;
  std::string decode(std::span<const int32_t> ids) const;
  // The bytes of one token. Byte-level tokens decode independently of their neighbours, so a
  // stream may emit tokens one by one (a UTF-8 character may span tokens: see utf8.h).
  std::string_view decode_token(int32_t id) const;

  int32_t vocab_size() const;  // one more than the largest id
  // The id of an added token by its content, else of a vocab token by its raw bytes.
  std::optional<int32_t> token_id(std::string_view token) const;
  // The id of a special token; a hyla::Error if this tokenizer lacks it.
  int32_t special_id(std::string_view content) const;
  bool is_special(int32_t id) const;

  const TokenizerSpec& spec() const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

}  // namespace hyla
