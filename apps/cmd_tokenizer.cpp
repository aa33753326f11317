#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/data/bpe_trainer.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"

namespace hyla::cli {

namespace {

constexpr const char* kTokenizerArgument = "tokenizer.json, or a model (directory, Kimi checkpoint, GGUF) whose tokenizer to use";

void add_tokenizer_train(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("train", "Train a byte-level BPE tokenizer (with the SPEC §8 special tokens)");
  static std::vector<std::string> inputs;
  static std::string out;
  static int32_t vocab_size = 8192;
  cmd->add_option("--input", inputs, "Text files to train on")->required()->check(CLI::ExistingFile);
  cmd->add_option("--vocab-size", vocab_size, "Tokens in all: 256 bytes + merges + specials")->required();
  cmd->add_option("--out", out, "Output tokenizer.json")->required();
  cmd->callback([] {
    const auto start = std::chrono::steady_clock::now();
    BpeTrainOptions options;
    options.vocab_size = vocab_size;
    options.show_progress = true;
    const std::vector<std::filesystem::path> files(inputs.begin(), inputs.end());
    const Tokenizer tokenizer(train_bpe_files(files, options), "trained tokenizer");
    tokenizer.save(out);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("wrote {}: {} tokens ({} merges, {} special) in {:.2f} s\n", out, tokenizer.vocab_size(),
               tokenizer.spec().merges.size(), tokenizer.spec().added_tokens.size(), seconds);
    if (tokenizer.vocab_size() < vocab_size)
      fmt::print("note: the text ran out of pairs to merge; the vocabulary is {} rather than {}\n",
                 tokenizer.vocab_size(), vocab_size);
  });
}

void add_encode(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("encode", "Encode a file's raw bytes into a JSON list of token ids");
  static std::string tokenizer_path, input, out;
  static bool allow_special = false;
  cmd->add_option("--tokenizer", tokenizer_path, kTokenizerArgument)->required();
  cmd->add_option("--input", input, "File to encode (any bytes)")->required();
  cmd->add_option("--out", out, "Output JSON list of ids")->required();
  cmd->add_flag("--allow-special", allow_special, "Encode special-token text (e.g. <|endoftext|>) as the special ids");
  cmd->callback([] {
    const Tokenizer tokenizer = load_tokenizer_argument(tokenizer_path);
    const std::string text = read_file(input);
    const std::vector<int32_t> ids = tokenizer.encode(text, allow_special);
    write_file_atomic(out, nlohmann::json(ids).dump() + "\n");
    fmt::print("wrote {}: {} tokens from {} bytes\n", out, ids.size(), text.size());
  });
}

void add_decode(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("decode", "Decode a JSON list of token ids into raw bytes");
  static std::string tokenizer_path, input, out;
  cmd->add_option("--tokenizer", tokenizer_path, kTokenizerArgument)->required();
  cmd->add_option("--input", input, "JSON list of ids")->required();
  cmd->add_option("--out", out, "Output file (raw bytes)")->required();
  cmd->callback([] {
    const Tokenizer tokenizer = load_tokenizer_argument(tokenizer_path);
    const nlohmann::json list = parse_json_file(input);
    HYLA_CHECK(list.is_array(), "{}: must be a JSON list of token ids", input);
    std::vector<int32_t> ids;
    ids.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const nlohmann::json& v = list[i];
      const bool valid = v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < tokenizer.vocab_size();
      HYLA_CHECK(valid, "{}: element {} ({}) is not a token id of {} (vocab size {})", input, i, json_excerpt(v),
                 tokenizer_path, tokenizer.vocab_size());
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    const std::string text = tokenizer.decode(ids);
    write_file_atomic(out, text);
    fmt::print("wrote {}: {} bytes from {} tokens\n", out, text.size(), ids.size());
  });
}

}  // namespace

void add_tokenizer(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenizer", "Train byte-level BPE tokenizers; encode and decode files");
  cmd->require_subcommand(1);
  add_tokenizer_train(*cmd);
  add_encode(*cmd);
  add_decode(*cmd);
}

}  // namespace hyla::cli
