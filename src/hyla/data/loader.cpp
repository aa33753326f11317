#include "hyla/data/loader.h"

#include <fmt/format.h>

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

namespace hyla {

int64_t TokenWindows::used_rows() const {
  return int64_t(std::count_if(lengths.begin(), lengths.end(), [](int32_t n) { return n > 0; }));
}

TokenLoader::TokenLoader(const std::vector<std::filesystem::path>& shards, int64_t batch_size, int64_t seq_len,
                         LoaderMode mode, uint64_t seed)
    : batch_size_(batch_size), seq_len_(seq_len), mode_(mode), rng_(seed) {
  HYLA_CHECK(!shards.empty(), "the loader needs at least one token shard");
  HYLA_CHECK(batch_size > 0, "batch size must be positive, got {}", batch_size);
  shards_.reserve(shards.size());
  for (const auto& path : shards) shards_.emplace_back(path);
  for (const TokenShard& s : shards_)
    HYLA_CHECK(s.vocab_size() == shards_[0].vocab_size(), "{}: vocabulary size {} differs from {}'s {}",
               s.path().string(), s.vocab_size(), shards_[0].path().string(), shards_[0].vocab_size());
  set_seq_len(seq_len);
}

TokenLoader TokenLoader::from_directory(const std::filesystem::path& dir, const std::string& split,
                                        int64_t batch_size, int64_t seq_len, LoaderMode mode, uint64_t seed) {
  const std::string meta_path = (dir / "meta.json").string();
  const nlohmann::json meta = parse_json_file(meta_path);
  const nlohmann::json* names = nullptr;
  if (meta.contains("splits") && meta["splits"].contains(split) && meta["splits"][split].contains("shards"))
    names = &meta["splits"][split]["shards"];
  HYLA_CHECK(names && names->is_array(), "{}: no list splits.{}.shards", meta_path, split);
  std::vector<std::filesystem::path> shards;
  for (const auto& name : *names) {
    HYLA_CHECK(name.is_string(), "{}: splits.{}.shards must list file names", meta_path, split);
    shards.push_back(dir / name.get<std::string>());
  }
  return TokenLoader(shards, batch_size, seq_len, mode, seed);
}

void TokenLoader::set_seq_len(int64_t seq_len) {
  HYLA_CHECK(seq_len > 0, "sequence length must be positive, got {}", seq_len);
  seq_len_ = seq_len;
  if (mode_ == LoaderMode::Random) update_random_windows();
}

void TokenLoader::set_batch_size(int64_t batch_size) {
  HYLA_CHECK(batch_size > 0, "loader: batch size must be positive, got {}", batch_size);
  batch_size_ = batch_size;
}

void TokenLoader::update_random_windows() {
  window_starts_.assign(1, 0);
  for (const TokenShard& s : shards_) {
    const uint64_t width = uint64_t(seq_len_) + 1;
    window_starts_.push_back(window_starts_.back() + (s.size() >= width ? s.size() - width + 1 : 0));
  }
  HYLA_CHECK(window_starts_.back() > 0, "no token shard holds a window of {} tokens (sequence length {} + 1)",
             seq_len_ + 1, seq_len_);
}

uint64_t TokenLoader::windows_per_pass() const {
  uint64_t windows = 0;
  for (const TokenShard& s : shards_)
    if (s.size() >= 2) windows += (s.size() - 2) / uint64_t(seq_len_) + 1;
  return windows;
}

uint64_t TokenLoader::partial_windows_per_pass() const {
  uint64_t partial = 0;
  for (const TokenShard& s : shards_)
    if (s.size() >= 2 && (s.size() - 1) % uint64_t(seq_len_) != 0) ++partial;
  return partial;
}

void TokenLoader::read_window(size_t shard, uint64_t offset, int64_t length, int32_t* row) {
  shards_[shard].read(offset, std::span<int32_t>(row, size_t(length)));
}

bool TokenLoader::next(TokenWindows& batch) {
  const int64_t width = seq_len_ + 1;
  batch.rows = batch_size_;
  batch.width = width;
  batch.tokens.assign(size_t(batch_size_ * width), -1);
  batch.lengths.assign(size_t(batch_size_), 0);
  const bool filled = mode_ == LoaderMode::Random ? next_random(batch) : next_sequential(batch);
  if (filled) ++batches_;
  return filled;
}

bool TokenLoader::next_random(TokenWindows& batch) {
  for (int64_t r = 0; r < batch_size_; ++r) {
    const uint64_t start = rng_.below(window_starts_.back());
    shard_ = size_t(std::upper_bound(window_starts_.begin(), window_starts_.end(), start) - window_starts_.begin() - 1);
    offset_ = start - window_starts_[shard_];
    read_window(shard_, offset_, batch.width, batch.tokens.data() + r * batch.width);
    batch.lengths[size_t(r)] = int32_t(batch.width);
  }
  return true;
}

bool TokenLoader::next_sequential(TokenWindows& batch) {
  int64_t r = 0;
  while (r < batch_size_ && shard_ < shards_.size()) {
    const uint64_t size = shards_[shard_].size();
    if (offset_ + 1 >= size) {  // fewer than two tokens left: no target remains in this shard
      ++shard_;
      offset_ = 0;
      continue;
    }
    const int64_t length = int64_t(std::min<uint64_t>(uint64_t(batch.width), size - offset_));
    read_window(shard_, offset_, length, batch.tokens.data() + r * batch.width);
    batch.lengths[size_t(r)] = int32_t(length);
    offset_ += uint64_t(seq_len_);
    ++r;
  }
  return r > 0;
}

nlohmann::json TokenLoader::state() const {
  nlohmann::json rng = nlohmann::json::array();
  for (uint64_t word : rng_.state()) rng.push_back(fmt::format("{:016x}", word));
  nlohmann::json shards = nlohmann::json::array();
  for (const TokenShard& s : shards_) shards.push_back(s.path().filename().string());
  return {{"mode", mode_ == LoaderMode::Random ? "random" : "sequential"},
          {"batch_size", batch_size_},
          {"seq_len", seq_len_},
          {"shards", shards},
          {"shard", shard_},
          {"offset", offset_},
          {"batches", batches_},
          {"rng", rng}};
}

void TokenLoader::set_state(const nlohmann::json& json) {
  JsonFields fields(json, "loader state");
  std::string mode;
  int64_t batch_size = 0, seq_len = 0, shard = 0, offset = 0, batches = 0;
  std::vector<std::string> shards, rng;
  fields.read("mode", mode);
  fields.read("batch_size", batch_size);
  fields.read("seq_len", seq_len);
  fields.read("shards", shards);
  fields.read("shard", shard);
  fields.read("offset", offset);
  fields.read("batches", batches);
  fields.read("rng", rng);
  fields.finish();
  const std::string expected_mode = mode_ == LoaderMode::Random ? "random" : "sequential";
  HYLA_CHECK(mode == expected_mode, "loader state: mode '{}' does not match this loader's '{}'", mode, expected_mode);
  HYLA_CHECK(batch_size == batch_size_, "loader state: batch_size {} does not match this loader's {}", batch_size,
             batch_size_);
  HYLA_CHECK(shards.size() == shards_.size(), "loader state: {} shards, this loader has {}", shards.size(),
             shards_.size());
  for (size_t i = 0; i < shards.size(); ++i)
    HYLA_CHECK(shards[i] == shards_[i].path().filename().string(), "loader state: shard {} is '{}', this loader has '{}'",
               i, shards[i], shards_[i].path().filename().string());
  HYLA_CHECK(shard >= 0 && size_t(shard) <= shards_.size() && offset >= 0 && batches >= 0,
             "loader state: shard {} / offset {} out of range", shard, offset);
  HYLA_CHECK(rng.size() == 5, "loader state: rng must hold 5 words, got {}", rng.size());
  std::array<uint64_t, 5> words{};
  for (size_t i = 0; i < 5; ++i) {
    size_t used = 0;
    try {
      words[i] = std::stoull(rng[i], &used, 16);
    } catch (const std::exception&) {
      used = 0;
    }
    HYLA_CHECK(used == rng[i].size() && used > 0, "loader state: rng[{}] '{}' is not a hex number", i, rng[i]);
  }
  set_seq_len(seq_len);
  shard_ = size_t(shard);
  offset_ = uint64_t(offset);
  batches_ = uint64_t(batches);
  rng_.set_state(words);
}

}  // namespace hyla
