#pragma once
// Batches of token windows from token shards (memory-mapped, never copied whole).
//
// A batch is [B, T+1] int32: inputs are columns 0..T-1, targets columns 1..T.
// - Random mode (training): each row starts at a uniformly random offset, drawn from a seeded
//   hyla::Rng, among all windows that fit inside one shard. It never runs out.
// - Sequential mode (evaluation): windows start at 0, T, 2T, ... in each shard, so every token after
//   a shard's first is a target exactly once. The last window of a shard may be shorter (its length
//   is reported and the rest of the row is -1); the pass ends after the last shard.
// The state (mode, sizes, shard, offset, RNG) round-trips through JSON exactly, and T may change
// between batches (curriculum stages) without restarting.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/core/random.h"
#include "hyla/data/token_shard.h"

namespace hyla {

enum class LoaderMode { Random, Sequential };

struct TokenWindows {
  int64_t rows = 0, width = 0;   // B and T + 1
  std::vector<int32_t> tokens;   // rows * width, row-major; -1 past a row's length
  std::vector<int32_t> lengths;  // valid tokens per row: width, fewer for a last partial window, 0 for an unused row
  int64_t used_rows() const;
};

class TokenLoader {
 public:
  TokenLoader(const std::vector<std::filesystem::path>& shards, int64_t batch_size, int64_t seq_len, LoaderMode mode,
              uint64_t seed = 0);
  // The shards of one split ("train" or "val") listed in a prepared directory's meta.json.
  static TokenLoader from_directory(const std::filesystem::path& dir, const std::string& split, int64_t batch_size,
                                    int64_t seq_len, LoaderMode mode, uint64_t seed = 0);

  // Fills `batch`; false (and an empty batch) once a sequential pass is over.
  bool next(TokenWindows& batch);
  void set_seq_len(int64_t seq_len);
  // A curriculum stage may also change the number of sequences per batch.
  void set_batch_size(int64_t batch_size);
  int64_t seq_len() const { return seq_len_; }
  int64_t batch_size() const { return batch_size_; }
  // Sequential mode: windows in one pass over all shards at the current T, and how many of them are short.
  uint64_t windows_per_pass() const;
  uint64_t partial_windows_per_pass() const;

  nlohmann::json state() const;
  // Restores a state saved by a loader over the same shards with the same batch size and mode.
  void set_state(const nlohmann::json& state);

 private:
  void read_window(size_t shard, uint64_t offset, int64_t length, int32_t* row);
  bool next_random(TokenWindows& batch);
  bool next_sequential(TokenWindows& batch);
  void update_random_windows();

  std::vector<TokenShard> shards_;
  int64_t batch_size_, seq_len_;
  LoaderMode mode_;
  Rng rng_;
  size_t shard_ = 0;     // sequential: the shard being read; random: the shard of the last window
  uint64_t offset_ = 0;  // sequential: the next window's start; random: the last window's start
  uint64_t batches_ = 0;
  std::vector<uint64_t> window_starts_;  // random: running count of window starts before each shard
};

}  // namespace hyla
