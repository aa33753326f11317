#pragma once
// `hyla data prepare`: text files -> token shards for training plus a held-out validation shard.
//
// Documents are the blank-line separated blocks of each input (corpus.h; a chapter of kjv). Each
// is encoded on its own (OpenMP over documents) and followed by <|endoftext|>. A seeded shuffle
// picks round(val_fraction * documents) of them (at least one when val_fraction > 0) for
// validation; the rest, in input order, are training data. Shards break between documents once
// they hold shard_tokens. The output does not depend on the thread count.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hyla/data/tokenizer.h"

namespace hyla {

struct PrepareOptions {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out_dir;
  double val_fraction = 0.01;
  uint64_t seed = 0;
  uint64_t shard_tokens = uint64_t(1) << 28;
  bool show_progress = false;
};

struct PrepareSummary {
  uint64_t documents[2] = {0, 0};  // [train, val]
  uint64_t tokens[2] = {0, 0};
  uint64_t bytes = 0;
  std::vector<std::string> shards[2];
};

// Writes out_dir (atomically: replaced whole or not at all) with train-NNNNN.bin, val-NNNNN.bin and
// meta.json. `tokenizer_file` is hashed into meta.json so a dataset can be matched to its tokenizer.
PrepareSummary prepare_token_dataset(const Tokenizer& tokenizer, const std::filesystem::path& tokenizer_file,
                                     const PrepareOptions& options);

}  // namespace hyla
