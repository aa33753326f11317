#include "hyla/data/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>

#include "hyla/core/error.h"
#include "hyla/core/string_map.h"
#include "hyla/data/bpe.h"
#include "hyla/data/byte_level.h"
#include "hyla/data/pre_tokenizer.h"
#include "hyla/data/tokenizer_json.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"

namespace hyla {

namespace {

enum class TokenKind : uint8_t { Absent, Vocab, Added, Special };

// Pieces longer than this are encoded without caching: they are rare and would crowd the cache.
constexpr size_t kMaxCachedPiece = 64;
constexpr size_t kMaxCachedIds = size_t(1) << 22;
constexpr int32_t kMaxTokenId = 1 << 24;
constexpr int64_t kMaxUnusedTokenIds = 1 << 16;

std::atomic<uint64_t> next_serial{1};

}  // namespace

struct Tokenizer::State {
  uint64_t serial = next_serial++;
  std::string source;
  TokenizerSpec spec;
  std::vector<std::string> bytes_of;  // by id
  std::vector<TokenKind> kind;        // by id
  StringMap<int32_t> vocab_by_bytes;
  std::array<int32_t, 256> byte_token{};  // -1: no token for that byte
  MergeTable merges;
  std::vector<const AddedToken*> added_longest_first;
  std::array<bool, 256> starts_added{};  // first bytes of added tokens, to skip the rest quickly
  PreTokenizer pre_tokenizer;

  State(TokenizerSpec s, const std::string& source_name)
      : source(source_name), spec(std::move(s)), pre_tokenizer(spec.pre_tokenizer, source) {}
};

namespace {

// Per-thread encoding scratch: regex match data, BPE buffers and a cache of piece -> ids for the
// tokenizer used last on this thread (natural text repeats its pieces constantly).
struct EncodeScratch {
  struct CachedIds {
    uint32_t offset, length;
  };
  uint64_t owner = 0;
  RegexMatchData match_data;
  BpeScratch bpe;
  std::vector<int32_t> piece_ids;
  StringMap<CachedIds> cache;
  std::vector<int32_t> cached_ids;

  void reset(uint64_t serial) {
    owner = serial;
    cache.clear();
    cached_ids.clear();
  }
};

EncodeScratch& scratch_for(uint64_t serial) {
  thread_local EncodeScratch scratch;
  if (scratch.owner != serial) scratch.reset(serial);
  return scratch;
}

}  // namespace

Tokenizer::Tokenizer(TokenizerSpec spec, const std::string& source) {
  auto state = std::make_shared<State>(std::move(spec), source);
  const TokenizerSpec& s = state->spec;
  int32_t max_id = -1;
  for (const auto& [id, bytes] : s.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : s.added_tokens) max_id = std::max(max_id, t.id);
  HYLA_CHECK(max_id >= 0, "{}: the vocabulary is empty", source);
  // Ids index dense tables; a stray huge id would make them gigabytes.
  HYLA_CHECK(max_id < kMaxTokenId, "{}: token id {} is too large (hyla accepts ids below {})", source, max_id,
             kMaxTokenId);
  // Real vocabularies leave a few ids unassigned (reserved specials); a file of a few tokens
  // naming an id in the millions would cost its table, not its size.
  const int64_t unused = int64_t(max_id) + 1 - int64_t(s.vocab.size() + s.added_tokens.size());
  HYLA_CHECK(unused <= kMaxUnusedTokenIds, "{}: token id {} leaves {} ids below it unassigned (hyla accepts at most {})",
             source, max_id, unused, kMaxUnusedTokenIds);
  state->bytes_of.resize(size_t(max_id) + 1);
  state->kind.assign(size_t(max_id) + 1, TokenKind::Absent);

  for (const auto& [id, bytes] : s.vocab) {
    HYLA_CHECK(id >= 0, "{}: model.vocab: token '{}' has negative id {}", source, byte_level_encode(bytes), id);
    HYLA_CHECK(state->kind[size_t(id)] == TokenKind::Absent, "{}: model.vocab: id {} is used twice", source, id);
    HYLA_CHECK(!bytes.empty(), "{}: model.vocab: token {} is empty", source, id);
    const bool fresh = state->vocab_by_bytes.emplace(bytes, id).second;
    HYLA_CHECK(fresh, "{}: model.vocab: token '{}' appears twice", source, byte_level_encode(bytes));
    state->bytes_of[size_t(id)] = bytes;
    state->kind[size_t(id)] = TokenKind::Vocab;
  }
  // Files trained without the full byte alphabet lack some byte tokens; encoding such a byte is an
  // error (HF would drop it silently).
  for (int b = 0; b < 256; ++b) {
    const char byte = char(b);
    auto it = state->vocab_by_bytes.find(std::string_view(&byte, 1));
    state->byte_token[size_t(b)] = it == state->vocab_by_bytes.end() ? -1 : it->second;
  }
  for (size_t rank = 0; rank < s.merges.size(); ++rank) {
    const auto [left, right] = s.merges[rank];
    const bool known = left >= 0 && right >= 0 && left <= max_id && right <= max_id &&
                       state->kind[size_t(left)] == TokenKind::Vocab && state->kind[size_t(right)] == TokenKind::Vocab;
    HYLA_CHECK(known, "{}: model.merges[{}] refers to a token id outside model.vocab", source, rank);
    const std::string merged = state->bytes_of[size_t(left)] + state->bytes_of[size_t(right)];
    auto it = state->vocab_by_bytes.find(merged);
    HYLA_CHECK(it != state->vocab_by_bytes.end(), "{}: model.merges[{}] ('{} {}') makes '{}', which is not in model.vocab",
               source, rank, byte_level_encode(state->bytes_of[size_t(left)]),
               byte_level_encode(state->bytes_of[size_t(right)]), byte_level_encode(merged));
    state->merges.add(left, right, int32_t(rank), it->second);
  }
  for (const AddedToken& t : s.added_tokens) {
    HYLA_CHECK(t.id >= 0, "{}: added token '{}' has negative id {}", source, t.content, t.id);
    HYLA_CHECK(!t.content.empty(), "{}: added token {} has empty content", source, t.id);
    TokenKind& kind = state->kind[size_t(t.id)];
    // GPT-2-style files list a special both in model.vocab and in added_tokens, with one id.
    HYLA_CHECK(kind == TokenKind::Absent || (kind == TokenKind::Vocab && state->bytes_of[size_t(t.id)] == t.content),
               "{}: added token '{}' reuses id {} of another token", source, t.content, t.id);
    kind = t.special ? TokenKind::Special : TokenKind::Added;
    state->bytes_of[size_t(t.id)] = t.content;
    state->added_longest_first.push_back(&t);
    state->starts_added[uint8_t(t.content[0])] = true;
  }
  std::stable_sort(state->added_longest_first.begin(), state->added_longest_first.end(),
                   [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  for (size_t i = 1; i < state->added_longest_first.size(); ++i)
    HYLA_CHECK(state->added_longest_first[i]->content != state->added_longest_first[i - 1]->content,
               "{}: added token '{}' appears twice", source, state->added_longest_first[i]->content);
  state_ = std::move(state);
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  return from_json(parse_json_file(path.string()), path.string());
}

Tokenizer Tokenizer::from_json(const nlohmann::json& json, const std::string& source) {
  return Tokenizer(parse_tokenizer_json(json, source), source);
}

nlohmann::ordered_json Tokenizer::to_json() const { return tokenizer_json(state_->spec); }

void Tokenizer::save(const std::filesystem::path& path) const {
  write_file_atomic(path, to_json().dump(2) + "\n");
}

const TokenizerSpec& Tokenizer::spec() const { return state_->spec; }

int32_t Tokenizer::vocab_size() const { return int32_t(state_->bytes_of.size()); }

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  encode_append(text, allow_special, ids);
  return ids;
}

void Tokenizer::encode_append(std::string_view text, bool allow_special, std::vector<int32_t>& out) const {
  const State& s = *state_;
  EncodeScratch& scratch = scratch_for(s.serial);
  auto encode_piece = [&](std::string_view piece) {
    const bool cacheable = piece.size() <= kMaxCachedPiece;
    if (cacheable) {
      if (auto it = scratch.cache.find(piece); it != scratch.cache.end()) {
        const int32_t* ids = scratch.cached_ids.data() + it->second.offset;
        out.insert(out.end(), ids, ids + it->second.length);
        return;
      }
    }
    auto& ids = scratch.piece_ids;
    size_t count = 1;
    if (auto it = s.spec.ignore_merges ? s.vocab_by_bytes.find(piece) : s.vocab_by_bytes.end();
        it != s.vocab_by_bytes.end()) {
      ids.assign(1, it->second);
    } else {
      ids.resize(piece.size());
      for (size_t i = 0; i < piece.size(); ++i) {
        ids[i] = s.byte_token[uint8_t(piece[i])];
        HYLA_CHECK(ids[i] >= 0, "{}: cannot encode byte 0x{:02x}: the vocabulary has no token for it", s.source,
                   uint8_t(piece[i]));
      }
      count = apply_merges(s.merges, ids, scratch.bpe);
    }
    out.insert(out.end(), ids.begin(), ids.begin() + ptrdiff_t(count));
    if (!cacheable) return;
    if (scratch.cached_ids.size() + count > kMaxCachedIds) scratch.reset(scratch.owner);
    scratch.cache.emplace(std::string(piece),
                          EncodeScratch::CachedIds{uint32_t(scratch.cached_ids.size()), uint32_t(count)});
    scratch.cached_ids.insert(scratch.cached_ids.end(), ids.begin(), ids.begin() + ptrdiff_t(count));
  };
  auto encode_plain = [&](std::string_view plain) { s.pre_tokenizer.split(plain, scratch.match_data, encode_piece); };
  if (!allow_special || s.added_longest_first.empty()) {
    encode_plain(text);
    return;
  }
  size_t plain_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* match = nullptr;
    if (s.starts_added[uint8_t(text[i])])
      for (const AddedToken* t : s.added_longest_first)
        if (text.compare(i, t->content.size(), t->content) == 0) {
          match = t;
          break;
        }
    if (!match) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_begin, i - plain_begin));
    out.push_back(match->id);
    i += match->content.size();
    plain_begin = i;
  }
  encode_plain(text.substr(plain_begin));
}

std::string_view Tokenizer::decode_token(int32_t id) const {
  const State& s = *state_;
  HYLA_CHECK(id >= 0 && id < int32_t(s.kind.size()) && s.kind[size_t(id)] != TokenKind::Absent,
             "token id {} is not in the vocabulary (size {})", id, s.kind.size());
  return s.bytes_of[size_t(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  size_t bytes = 0;
  for (int32_t id : ids) bytes += decode_token(id).size();
  std::string text;
  text.reserve(bytes);
  for (int32_t id : ids) text += state_->bytes_of[size_t(id)];
  return text;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  for (const AddedToken* t : state_->added_longest_first)
    if (t->content == token) return t->id;
  if (auto it = state_->vocab_by_bytes.find(token); it != state_->vocab_by_bytes.end()) return it->second;
  return std::nullopt;
}

int32_t Tokenizer::special_id(std::string_view content) const {
  for (const AddedToken* t : state_->added_longest_first)
    if (t->content == content && t->special) return t->id;
  fail("the tokenizer has no special token '{}'", content);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < int32_t(state_->kind.size()) && state_->kind[size_t(id)] == TokenKind::Special;
}

}  // namespace hyla
