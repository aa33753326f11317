#include "hyla/data/bpe_trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/core/string_map.h"
#include "hyla/core/threads.h"
#include "hyla/data/byte_level.h"
#include "hyla/data/pre_tokenizer.h"
#include "hyla/io/file.h"

namespace hyla {

namespace {

constexpr size_t kChunkBytes = size_t(1) << 20;

// Cuts text into pieces of about kChunkBytes for parallel counting. A cut goes between a newline and
// an ASCII letter, which no match of the default pattern spans (and no special token contains), so
// the pieces counted are those of the whole text. The cuts depend on the text alone, never on the
// thread count.
void append_chunks(std::string_view text, std::vector<std::string_view>& chunks) {
  while (text.size() > kChunkBytes) {
    size_t cut = kChunkBytes;
    while (cut < text.size() && !(text[cut - 1] == '\n' && std::isalpha(uint8_t(text[cut])))) ++cut;
    chunks.push_back(text.substr(0, cut));
    text.remove_prefix(cut);
  }
  if (!text.empty()) chunks.push_back(text);
}

// Calls emit(plain) for each stretch of text between occurrences of the special tokens.
template <typename Emit>
void for_each_plain(std::string_view text, const std::vector<std::string>& specials, Emit&& emit) {
  while (!text.empty()) {
    size_t first = text.size(), length = 0;
    for (const std::string& s : specials)
      if (size_t at = text.substr(0, first + s.size()).find(s); at != std::string_view::npos && at <= first) {
        if (at < first || s.size() > length) first = at, length = s.size();
      }
    emit(text.substr(0, first));
    if (first == text.size()) return;
    text.remove_prefix(first + length);
  }
}

StringMap<int64_t> count_pieces(std::span<const std::string_view> texts, const BpeTrainOptions& options) {
  std::vector<std::string_view> chunks;
  uint64_t total_bytes = 0;
  for (std::string_view t : texts) append_chunks(t, chunks), total_bytes += t.size();
  PreTokenizerConfig config;
  config.splits.push_back({options.pattern, false});
  const PreTokenizer pre_tokenizer(config, "bpe trainer");

  std::optional<Progress> progress;
  if (options.show_progress) progress.emplace("count pieces", total_bytes);
  StringMap<int64_t> counts;
  FirstException error;
#pragma omp parallel
  {
    StringMap<int64_t> local;
    RegexMatchData match_data;
#pragma omp for schedule(dynamic, 1)
    for (size_t c = 0; c < chunks.size(); ++c) {
      error.run([&] {
        for_each_plain(chunks[c], options.special_tokens, [&](std::string_view plain) {
          pre_tokenizer.split(plain, match_data, [&](std::string_view piece) {
            if (auto it = local.find(piece); it != local.end()) ++it->second;
            else local.emplace(piece, 1);
          });
        });
      });
      if (progress) progress->advance(chunks[c].size());
    }
#pragma omp critical(hyla_bpe_merge_counts)
    {
      if (counts.empty()) counts = std::move(local);
      else for (auto& [piece, n] : local) counts[piece] += n;
    }
  }
  error.rethrow();
  return counts;
}

class BpeTrainer {
 public:
  BpeTrainer(const StringMap<int64_t>& piece_counts) {
    std::array<int32_t, 256> byte_id{};
    for (int i = 0; i < 256; ++i) {
      const uint8_t b = byte_level_order()[size_t(i)];
      byte_id[b] = i;
      add_token(std::string(1, char(b)));
    }
    // Words in byte order, so that everything below is independent of hash-map iteration order.
    std::vector<std::pair<std::string_view, int64_t>> sorted(piece_counts.begin(), piece_counts.end());
    std::sort(sorted.begin(), sorted.end());
    for (const auto& [piece, count] : sorted) {
      if (piece.size() < 2) continue;  // no pairs to learn from
      Word word{std::vector<int32_t>(piece.size()), count};
      for (size_t i = 0; i < piece.size(); ++i) word.symbols[i] = byte_id[uint8_t(piece[i])];
      const auto w = int32_t(words_.size());
      for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
        Pair& pair = pairs_[key(word.symbols[i], word.symbols[i + 1])];
        pair.count += count;
        if (pair.words.empty() || pair.words.back() != w) pair.words.push_back(w);
      }
      words_.push_back(std::move(word));
    }
    for (const auto& [k, pair] : pairs_) heap_.push_back({pair.count, int32_t(k >> 32), int32_t(uint32_t(k))});
    std::make_heap(heap_.begin(), heap_.end(), LowerPriority{&tokens_});
    word_stamp_.assign(words_.size(), -1);
  }

  // Merges until there are `target` tokens or no pair is left.
  void run(int32_t target, bool show_progress) {
    std::optional<Progress> progress;
    if (show_progress) progress.emplace("merges", uint64_t(std::max(0, target - int32_t(tokens_.size()))), "merges");
    while (int32_t(tokens_.size()) < target && !heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), LowerPriority{&tokens_});
      const Entry top = heap_.back();
      heap_.pop_back();
      auto it = pairs_.find(key(top.left, top.right));
      const int64_t current = it == pairs_.end() ? 0 : it->second.count;
      if (current != top.count) {  // stale: the count fell since this entry was queued
        if (current > 0) push({current, top.left, top.right});
        continue;
      }
      merge(top.left, top.right, std::move(it->second.words));
      if (progress) progress->advance(1);
    }
  }

  TokenizerSpec spec(const BpeTrainOptions& options) const {
    TokenizerSpec spec;
    for (size_t id = 0; id < tokens_.size(); ++id) spec.vocab.emplace_back(int32_t(id), tokens_[id]);
    spec.merges = merges_;
    for (size_t i = 0; i < options.special_tokens.size(); ++i) {
      AddedToken token;
      token.id = int32_t(tokens_.size() + i);
      token.content = options.special_tokens[i];
      spec.added_tokens.push_back(std::move(token));
    }
    spec.pre_tokenizer.splits.push_back({options.pattern, false});
    return spec;
  }

 private:
  struct Word {
    std::vector<int32_t> symbols;
    int64_t count;
  };
  struct Pair {
    int64_t count = 0;
    std::vector<int32_t> words;  // words that contained the pair when it appeared (may be stale)
  };
  struct Entry {
    int64_t count;
    int32_t left, right;
  };
  // The heap's order: fewer occurrences is lower priority; among equal counts, lexicographically
  // larger (left bytes, right bytes) is lower priority.
  struct LowerPriority {
    const std::vector<std::string>* tokens;
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.count != b.count) return a.count < b.count;
      if (int c = (*tokens)[size_t(a.left)].compare((*tokens)[size_t(b.left)]); c != 0) return c > 0;
      return (*tokens)[size_t(a.right)].compare((*tokens)[size_t(b.right)]) > 0;
    }
  };
  static uint64_t key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

  int32_t add_token(std::string bytes) {
    auto [it, fresh] = id_of_.emplace(std::move(bytes), int32_t(tokens_.size()));
    if (fresh) tokens_.push_back(it->first);
    return it->second;
  }

  void push(const Entry& e) {
    heap_.push_back(e);
    std::push_heap(heap_.begin(), heap_.end(), LowerPriority{&tokens_});
  }

  void add_pair(int32_t left, int32_t right, int64_t delta) { pairs_[key(left, right)].count += delta; }

  void merge(int32_t left, int32_t right, std::vector<int32_t> affected) {
    // Two different pairs can spell the same bytes; the token then keeps its first id.
    const int32_t merged = add_token(tokens_[size_t(left)] + tokens_[size_t(right)]);
    const auto stamp = int32_t(merges_.size());
    merges_.emplace_back(left, right);
    new_pairs_.clear();
    for (int32_t w : affected) {
      if (word_stamp_[size_t(w)] == stamp) continue;
      word_stamp_[size_t(w)] = stamp;
      merge_in_word(w, left, right, merged);
    }
    pairs_.erase(key(left, right));
    std::sort(new_pairs_.begin(), new_pairs_.end());
    new_pairs_.erase(std::unique(new_pairs_.begin(), new_pairs_.end()), new_pairs_.end());
    for (uint64_t k : new_pairs_)
      if (const int64_t count = pairs_[k].count; count > 0) push({count, int32_t(k >> 32), int32_t(uint32_t(k))});
  }

  // Replaces each (left, right) in the word by `merged`, moving the word's pair counts from its old
  // pairs to its new ones. Pairs that contain `merged` are new; the others keep their word lists.
  void merge_in_word(int32_t w, int32_t left, int32_t right, int32_t merged) {
    Word& word = words_[size_t(w)];
    std::vector<int32_t>& s = word.symbols;
    bool present = false;
    for (size_t i = 0; i + 1 < s.size() && !present; ++i) present = s[i] == left && s[i + 1] == right;
    if (!present) return;  // a stale entry of the pair's word list
    for (size_t i = 0; i + 1 < s.size(); ++i) add_pair(s[i], s[i + 1], -word.count);
    size_t out = 0;
    for (size_t i = 0; i < s.size();) {
      if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) s[out++] = merged, i += 2;
      else s[out++] = s[i++];
    }
    s.resize(out);
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      add_pair(s[i], s[i + 1], word.count);
      if (s[i] != merged && s[i + 1] != merged) continue;
      const uint64_t k = key(s[i], s[i + 1]);
      std::vector<int32_t>& list = pairs_[k].words;
      if (list.empty() || list.back() != w) list.push_back(w);
      new_pairs_.push_back(k);
    }
  }

  std::vector<std::string> tokens_;  // id -> bytes
  StringMap<int32_t> id_of_;
  std::vector<Word> words_;
  std::vector<int32_t> word_stamp_;  // the merge that last visited each word
  std::unordered_map<uint64_t, Pair> pairs_;
  std::vector<Entry> heap_;
  std::vector<uint64_t> new_pairs_;
  std::vector<std::pair<int32_t, int32_t>> merges_;
};

}  // namespace

TokenizerSpec train_bpe(std::span<const std::string_view> texts, const BpeTrainOptions& options) {
  const auto specials = int32_t(options.special_tokens.size());
  HYLA_CHECK(options.vocab_size >= 256 + specials,
             "--vocab-size {} is too small: the 256 byte tokens and {} special tokens need at least {}",
             options.vocab_size, specials, 256 + specials);
  BpeTrainer trainer(count_pieces(texts, options));
  trainer.run(options.vocab_size - specials, options.show_progress);
  return trainer.spec(options);
}

TokenizerSpec train_bpe_files(std::span<const std::filesystem::path> files, const BpeTrainOptions& options) {
  HYLA_CHECK(!files.empty(), "tokenizer training needs at least one input file");
  std::vector<std::shared_ptr<const MappedFile>> maps;
  std::vector<std::string_view> texts;
  for (const auto& path : files) {
    auto map = MappedFile::open(path);
    const std::string_view text(reinterpret_cast<const char*>(map->data()), map->size());
    HYLA_CHECK(!text.empty(), "{}: empty file, nothing to train on", path.string());
    if (const void* nul = std::memchr(text.data(), 0, text.size()))
      fail("{}: binary file (NUL byte at offset {}); tokenizer training needs text", path.string(),
           static_cast<const char*>(nul) - text.data());
    texts.push_back(text);
    maps.push_back(std::move(map));
  }
  return train_bpe(texts, options);
}

}  // namespace hyla
