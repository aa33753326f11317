#include "hyla/data/prepare.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/core/random.h"
#include "hyla/core/threads.h"
#include "hyla/data/corpus.h"
#include "hyla/data/token_shard.h"
#include "hyla/io/file.h"

namespace hyla {

namespace {

// Documents are encoded in batches of about this many bytes, bounding memory on large corpora.
constexpr uint64_t kBatchBytes = uint64_t(64) << 20;

struct Document {
  uint32_t input;
  std::string_view text;
};

// Writes one split's shards, starting a new one between documents once a shard is full.
class SplitWriter {
 public:
  SplitWriter(std::filesystem::path dir, std::string name, int32_t vocab_size, uint64_t shard_tokens)
      : dir_(std::move(dir)), name_(std::move(name)), vocab_size_(vocab_size), shard_tokens_(shard_tokens) {}

  void add_document(std::span<const int32_t> ids) {
    if (writer_ && writer_->count() > 0 && writer_->count() + ids.size() > shard_tokens_) close_shard();
    if (!writer_) {
      shards_.push_back(fmt::format("{}-{:05}.bin", name_, shards_.size()));
      writer_.emplace(dir_ / shards_.back(), vocab_size_);
    }
    writer_->append(ids);
    tokens_ += ids.size();
    ++documents_;
  }
  // Commits the last shard; a split without documents still gets one (empty) shard.
  void finish() {
    if (!writer_ && shards_.empty()) add_empty_shard();
    if (writer_) close_shard();
  }
  uint64_t tokens() const { return tokens_; }
  uint64_t documents() const { return documents_; }
  const std::vector<std::string>& shards() const { return shards_; }

 private:
  void close_shard() {
    writer_->commit();
    writer_.reset();
  }
  void add_empty_shard() {
    shards_.push_back(fmt::format("{}-{:05}.bin", name_, shards_.size()));
    writer_.emplace(dir_ / shards_.back(), vocab_size_);
  }
  std::filesystem::path dir_;
  std::string name_;
  int32_t vocab_size_;
  uint64_t shard_tokens_, tokens_ = 0, documents_ = 0;
  std::vector<std::string> shards_;
  std::optional<TokenShardWriter> writer_;
};

// The validation documents: a seeded partial Fisher-Yates shuffle of the document indices.
std::vector<bool> choose_validation(size_t documents, double fraction, uint64_t seed) {
  std::vector<bool> is_val(documents, false);
  if (fraction <= 0) return is_val;
  const auto wanted = std::max<size_t>(1, size_t(std::llround(fraction * double(documents))));
  HYLA_CHECK(wanted < documents, "--val-fraction {} holds out {} of {} documents, leaving none for training",
             fraction, wanted, documents);
  std::vector<size_t> order(documents);
  for (size_t i = 0; i < documents; ++i) order[i] = i;
  Rng rng(seed);
  for (size_t i = 0; i < wanted; ++i) {
    std::swap(order[i], order[i + rng.below(documents - i)]);
    is_val[order[i]] = true;
  }
  return is_val;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

PrepareSummary prepare_token_dataset(const Tokenizer& tokenizer, const std::filesystem::path& tokenizer_file,
                                     const PrepareOptions& options) {
  HYLA_CHECK(!options.inputs.empty(), "data prepare needs at least one input file");
  HYLA_CHECK(options.val_fraction >= 0 && options.val_fraction < 1, "--val-fraction must be in [0, 1), got {}",
             options.val_fraction);
  HYLA_CHECK(options.shard_tokens > 0, "--shard-tokens must be positive");
  const int32_t eot = tokenizer.special_id("<|endoftext|>");

  std::vector<std::shared_ptr<const MappedFile>> maps;
  std::vector<Document> documents;
  std::vector<uint64_t> documents_per_input;
  uint64_t total_bytes = 0;
  for (const auto& path : options.inputs) {
    auto map = MappedFile::open(path);
    std::string_view rest(reinterpret_cast<const char*>(map->data()), map->size());
    HYLA_CHECK(!rest.empty(), "{}: empty file, no documents", path.string());
    if (const void* nul = std::memchr(rest.data(), 0, rest.size()))
      fail("{}: binary file (NUL byte at offset {}); data prepare reads text", path.string(),
           static_cast<const char*>(nul) - rest.data());
    const size_t before = documents.size();
    for (std::string_view doc = next_document(rest); !doc.empty(); doc = next_document(rest))
      documents.push_back({uint32_t(maps.size()), doc}), total_bytes += doc.size();
    HYLA_CHECK(documents.size() > before, "{}: no documents (only blank lines)", path.string());
    documents_per_input.push_back(documents.size() - before);
    maps.push_back(std::move(map));
  }
  const std::vector<bool> is_val = choose_validation(documents.size(), options.val_fraction, options.seed);

  AtomicDirectory out(options.out_dir);
  SplitWriter splits[2] = {{out.temp(), "train", tokenizer.vocab_size(), options.shard_tokens},
                           {out.temp(), "val", tokenizer.vocab_size(), options.shard_tokens}};
  std::optional<Progress> progress;
  if (options.show_progress) progress.emplace("tokenize", total_bytes);
  std::vector<std::vector<int32_t>> encoded;
  for (size_t first = 0; first < documents.size();) {
    size_t last = first;
    for (uint64_t bytes = 0; last < documents.size() && (last == first || bytes < kBatchBytes); ++last)
      bytes += documents[last].text.size();
    encoded.resize(last - first);
    FirstException error;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t d = first; d < last; ++d) {
      error.run([&] {
        std::vector<int32_t>& ids = encoded[d - first];
        ids.clear();
        tokenizer.encode_append(documents[d].text, false, ids);
        ids.push_back(eot);
      });
      if (progress) progress->advance(documents[d].text.size());
    }
    error.rethrow();
    for (size_t d = first; d < last; ++d) splits[is_val[d] ? 1 : 0].add_document(encoded[d - first]);
    first = last;
  }
  for (SplitWriter& s : splits) s.finish();
  if (progress) progress->finish();

  PrepareSummary summary;
  summary.bytes = total_bytes;
  nlohmann::ordered_json meta;
  meta["format"] = "hyla-token-shards";
  meta["version"] = kTokenShardVersion;
  // The directory carries its tokenizer, so a training run needs nothing else to decode its data.
  const std::string tokenizer_text = read_file(tokenizer_file);
  write_file_atomic(out.temp() / "tokenizer.json", tokenizer_text);
  meta["tokenizer"] = {{"file", "tokenizer.json"},
                       {"fnv1a64", hex64(hash_string(tokenizer_text))},
                       {"vocab_size", tokenizer.vocab_size()},
                       {"endoftext_id", eot}};
  meta["token_bytes"] = token_bytes_for_vocab(tokenizer.vocab_size());
  meta["seed"] = options.seed;
  meta["val_fraction"] = options.val_fraction;
  meta["document"] = "blank-line separated block; each followed by <|endoftext|>";
  meta["inputs"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < options.inputs.size(); ++i)
    meta["inputs"].push_back({{"path", options.inputs[i].string()},
                              {"bytes", maps[i]->size()},
                              {"documents", documents_per_input[i]}});
  const char* names[2] = {"train", "val"};
  for (int s = 0; s < 2; ++s) {
    summary.documents[s] = splits[s].documents();
    summary.tokens[s] = splits[s].tokens();
    summary.shards[s] = splits[s].shards();
    meta["splits"][names[s]] = {{"documents", summary.documents[s]},
                                {"tokens", summary.tokens[s]},
                                {"shards", summary.shards[s]}};
  }
  write_file_atomic(out.temp() / "meta.json", meta.dump(2) + "\n");
  out.commit();
  return summary;
}

}  // namespace hyla
