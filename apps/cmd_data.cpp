#include <fmt/format.h>

#include <chrono>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/data/corpus.h"
#include "hyla/data/fashion_mnist.h"
#include "hyla/data/image_records.h"
#include "hyla/data/prepare.h"
#include "hyla/io/file.h"

namespace hyla::cli {

namespace {

void add_fetch(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("fetch", "Write a corpus that ships with the system as plain text");
  static std::string corpus, out;
  cmd->add_option("corpus", corpus, "Corpus: kjv (the King James Bible, via the `bible` program)")
      ->required()
      ->check(CLI::IsMember({"kjv"}));
  cmd->add_option("--out", out, "Output text file")->required();
  cmd->callback([] {
    const std::string text = kjv_text();
    write_file_atomic(out, text);
    fmt::print("wrote {}: {} bytes\n", out, text.size());
  });
}

void add_prepare(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("prepare", "Tokenise text files into training and validation token shards");
  static std::string tokenizer_path;
  static std::vector<std::string> inputs;
  static PrepareOptions options;
  static std::string out;
  static bool force = false;
  cmd->add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  cmd->add_option("--input", inputs, "Text files; documents are their blank-line separated blocks")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", out, "Output directory (replaced whole: only an earlier prepare output, unless --force)")->required();
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->add_option("--val-fraction", options.val_fraction, "Fraction of documents held out for validation");
  cmd->add_option("--seed", options.seed, "Seed of the validation split");
  cmd->add_option("--shard-tokens", options.shard_tokens, "Tokens per shard before a new one starts");
  cmd->callback([] {
    const auto start = std::chrono::steady_clock::now();
    options.inputs.assign(inputs.begin(), inputs.end());
    std::vector<std::filesystem::path> read = options.inputs;
    read.emplace_back(tokenizer_path);
    check_replaceable_output(out, "meta.json", read, force);
    const Tokenizer tokenizer = Tokenizer::load(tokenizer_path);
    options.out_dir = out;
    options.show_progress = true;
    const PrepareSummary s = prepare_token_dataset(tokenizer, tokenizer_path, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("wrote {}: train {} documents, {} tokens in {} shard(s); val {} documents, {} tokens; {} in {:.2f} s\n",
               out, s.documents[0], s.tokens[0], s.shards[0].size(), s.documents[1], s.tokens[1],
               format_amount(double(s.bytes), "B"), seconds);
  });
}

void add_prepare_images(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("prepare-images", "Write image-caption records from an image dataset");
  static std::string dataset = "fashion-mnist", split = "all", dir = std::string(kFashionMnistDir), out;
  static bool force = false;
  cmd->add_option("--dataset", dataset, "Dataset")->check(CLI::IsMember({"fashion-mnist"}));
  cmd->add_option("--split", split, "train, test or all")->check(CLI::IsMember({"train", "test", "all"}));
  cmd->add_option("--dir", dir, "Directory of the dataset's idx*-ubyte.gz files");
  cmd->add_option("--out", out, "Output directory (replaced whole: only an earlier prepare-images output, unless --force)")->required();
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->callback([] {
    check_replaceable_output(out, "meta.json", {dir}, force);
    const std::vector<std::string> splits = split == "all" ? std::vector<std::string>{"train", "test"}
                                                           : std::vector<std::string>{split};
    AtomicDirectory directory(out);
    nlohmann::ordered_json meta = {{"format", "hyla-image-records"}, {"version", kImageRecordsVersion},
                                   {"dataset", dataset}, {"classes", kFashionMnistClasses}};
    for (const std::string& s : splits) {
      const LabeledImages data = load_fashion_mnist(dir, s);
      const IdxImages& images = data.images;
      const size_t pixels = size_t(images.rows * images.cols);
      ImageRecordWriter writer(directory.temp() / (s + ".bin"));
      for (int64_t i = 0; i < images.count; ++i) {
        const int label = data.labels[size_t(i)];
        writer.add({images.pixels.data() + size_t(i) * pixels, pixels}, int32_t(images.rows), int32_t(images.cols),
                   1, fashion_mnist_caption(label), label);
      }
      writer.commit();
      meta["splits"][s] = {{"file", s + ".bin"}, {"records", images.count}, {"height", images.rows},
                           {"width", images.cols}, {"channels", 1}};
      fmt::print("{}: {} records of {}x{}x1\n", s, images.count, images.rows, images.cols);
    }
    write_file_atomic(directory.temp() / "meta.json", meta.dump(2) + "\n");
    directory.commit();
    fmt::print("wrote {}\n", out);
  });
}

}  // namespace

void add_data(CLI::App& app) {
  auto* cmd = app.add_subcommand("data", "Fetch corpora; prepare token shards and image records for training");
  cmd->require_subcommand(1);
  add_fetch(*cmd);
  add_prepare(*cmd);
  add_prepare_images(*cmd);
}

}  // namespace hyla::cli
