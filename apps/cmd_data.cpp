#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <numeric>
#include <optional>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/core/random.h"
#include "hyla/data/corpus.h"
#include "hyla/data/documents.h"
#include "hyla/data/fashion_mnist.h"
#include "hyla/data/image_file.h"
#include "hyla/data/image_records.h"
#include "hyla/data/prepare.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"

namespace hyla::cli {

namespace {

void add_fetch(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("fetch", "Write a corpus that ships with the system as plain text");
  static std::string corpus, out;
  cmd->add_option("corpus", corpus,
                  "Corpus: kjv (the King James Bible, via the `bible` program) or devil (The Devil's Dictionary, "
                  "Debian package dict-devil: the long-context suite's held-out haystack)")
      ->required()
      ->check(CLI::IsMember({"kjv", "devil"}));
  cmd->add_option("--out", out, "Output text file")->required();
  cmd->callback([] {
    const std::string text = corpus == "kjv" ? kjv_text() : devil_text();
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

// One line of a prepare-images list (docs/data.md): an image file and its caption, whose first
// prompt_bytes bytes are a question that gets no loss.
struct ListedImage {
  std::filesystem::path image;
  std::string caption;
  int32_t prompt_bytes = 0, label = -1;
  int64_t line = 0;
};

std::vector<ListedImage> read_image_list(const std::filesystem::path& list) {
  const std::string text = read_file(list);
  std::vector<ListedImage> entries;
  int64_t number = 0;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{} line {}", list.string(), number);
    const nlohmann::json object = parse_json(line, where);
    JsonFields fields(object, where);
    std::string image, caption, question, answer;
    int64_t label = -1;
    fields.read("image", image);
    fields.read("text", caption);
    fields.read("question", question);
    fields.read("answer", answer);
    fields.read("label", label);
    fields.finish();
    HYLA_CHECK(!image.empty(), "{}: no \"image\" (the image file's path)", where);
    const bool captioned = fields.has("text"), asked = fields.has("question") || fields.has("answer");
    HYLA_CHECK(captioned != asked && (captioned || (fields.has("question") && fields.has("answer"))),
               "{}: {}: give either \"text\" (a caption) or both \"question\" and \"answer\"", where, image);
    HYLA_CHECK(!(captioned ? caption : answer).empty(), "{}: {}: the {} is empty", where, image,
               captioned ? "text" : "answer");
    HYLA_CHECK(!fields.has("label") || (label >= 0 && label <= INT32_MAX),
               "{}: {}: label must be 0 to 2147483647, got {}", where, image, label);
    // Relative paths are the list's (a list moves with its images); `/` keeps an absolute one.
    const std::filesystem::path path = list.parent_path() / image;
    if (captioned) entries.push_back({path, caption, 0, int32_t(label), number});
    else entries.push_back({path, question + answer, int32_t(question.size()), int32_t(label), number});
  }
  HYLA_CHECK(!entries.empty(), "{}: no images listed", list.string());
  return entries;
}

// Each entry's split (0 train, 1 val, 2 test): a seeded partial Fisher-Yates shuffle picks the held-out ones.
std::vector<int> choose_splits(size_t count, double val_fraction, double test_fraction, uint64_t seed) {
  const auto held_out = [&](double fraction) {
    return fraction > 0 ? std::max<size_t>(1, size_t(std::llround(fraction * double(count)))) : size_t(0);
  };
  const size_t val = held_out(val_fraction), test = held_out(test_fraction);
  HYLA_CHECK(val + test < count, "--val-fraction {} and --test-fraction {} hold out {} of {} images, leaving none for training",
             val_fraction, test_fraction, val + test, count);
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), size_t(0));
  std::vector<int> split(count, 0);
  Rng rng(seed);
  for (size_t i = 0; i < val + test; ++i) {
    std::swap(order[i], order[i + rng.below(count - i)]);
    split[order[i]] = i < val ? 1 : 2;
  }
  return split;
}

// The records of one split; their sizes go into meta.json only when every record shares them.
struct SplitOutput {
  std::string name;
  std::optional<ImageRecordWriter> writer;
  std::optional<int64_t> height, width, channels;
  bool mixed_size = false, mixed_channels = false;
  void add(const Image& image, const ListedImage& entry) {
    writer->add(image.pixels, int32_t(image.height), int32_t(image.width), int32_t(image.channels), entry.caption,
                entry.label, entry.prompt_bytes);
    mixed_size |= height && (*height != image.height || *width != image.width);
    mixed_channels |= channels && *channels != image.channels;
    height = image.height, width = image.width, channels = image.channels;
  }
  nlohmann::ordered_json meta() const {
    nlohmann::ordered_json m = {{"file", name + ".bin"}, {"records", writer->count()}};
    if (height && !mixed_size) m["height"] = *height, m["width"] = *width;
    if (channels && !mixed_channels) m["channels"] = *channels;
    return m;
  }
};

void prepare_image_list(const std::filesystem::path& list, const std::filesystem::path& out, double val_fraction,
                        double test_fraction, uint64_t seed, bool force) {
  const std::vector<ListedImage> entries = read_image_list(list);
  const std::vector<int> split = choose_splits(entries.size(), val_fraction, test_fraction, seed);
  std::vector<std::filesystem::path> inputs = {list};
  for (const ListedImage& e : entries) inputs.push_back(e.image);
  check_replaceable_output(out, "meta.json", inputs, force);
  AtomicDirectory directory(out);
  SplitOutput splits[3] = {{"train"}, {"val"}, {"test"}};
  const double fractions[3] = {1, val_fraction, test_fraction};
  for (int s = 0; s < 3; ++s)
    if (fractions[s] > 0) splits[s].writer.emplace(directory.temp() / (splits[s].name + ".bin"));
  Progress progress("images", entries.size(), "images");
  for (size_t i = 0; i < entries.size(); ++i) {
    const ListedImage& entry = entries[i];
    Image image;
    try {
      image = read_image_file(entry.image);
    } catch (const Error& e) {
      fail("{} line {}: {}", list.string(), entry.line, e.what());
    }
    splits[split[i]].add(image, entry);
    progress.advance(1);
  }
  progress.finish();
  nlohmann::ordered_json meta = {{"format", "hyla-image-records"}, {"version", kImageRecordsVersion},
                                 {"input", list.string()}, {"seed", seed}, {"val_fraction", val_fraction},
                                 {"test_fraction", test_fraction}};
  for (SplitOutput& s : splits) {
    if (!s.writer) continue;
    s.writer->commit();
    meta["splits"][s.name] = s.meta();
    fmt::print("{}: {} records\n", s.name, s.writer->count());
  }
  write_file_atomic(directory.temp() / "meta.json", meta.dump(2) + "\n");
  directory.commit();
}

void prepare_fashion_mnist(const std::string& dir, const std::string& split, const std::filesystem::path& out,
                           bool force) {
  check_replaceable_output(out, "meta.json", {dir}, force);
  const std::vector<std::string> splits = split == "all" ? std::vector<std::string>{"train", "test"}
                                                         : std::vector<std::string>{split};
  AtomicDirectory directory(out);
  nlohmann::ordered_json meta = {{"format", "hyla-image-records"}, {"version", kImageRecordsVersion},
                                 {"dataset", "fashion-mnist"}, {"classes", kFashionMnistClasses}};
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
}

void add_prepare_images(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("prepare-images", "Write image-caption records from an image dataset or a list of image files");
  static std::string dataset = "fashion-mnist", split = "all", dir = std::string(kFashionMnistDir), input, out;
  static double val_fraction = 0.05, test_fraction = 0;
  static uint64_t seed = 0;
  static bool force = false;
  auto* dataset_option = cmd->add_option("--dataset", dataset, "Dataset (the default without --input)")
                             ->check(CLI::IsMember({"fashion-mnist"}));
  auto* split_option = cmd->add_option("--split", split, "--dataset's split: train, test or all")
                           ->check(CLI::IsMember({"train", "test", "all"}));
  auto* dir_option = cmd->add_option("--dir", dir, "Directory of the dataset's idx*-ubyte.gz files");
  auto* input_option = cmd->add_option("--input", input,
                                       "A JSON-lines list of images and captions or questions and answers (docs/data.md)")
                           ->check(CLI::ExistingFile);
  for (auto* option : {dataset_option, split_option, dir_option}) input_option->excludes(option);
  cmd->add_option("--val-fraction", val_fraction, "--input: fraction of images held out for validation")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--test-fraction", test_fraction, "--input: fraction of images held out for testing")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", seed, "--input: seed of the validation and test split");
  cmd->add_option("--out", out, "Output directory (replaced whole: only an earlier prepare-images output, unless --force)")->required();
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->callback([cmd] {
    if (input.empty()) {
      for (const char* flag : {"--val-fraction", "--test-fraction", "--seed"})
        HYLA_CHECK(cmd->count(flag) == 0, "{} applies to --input lists only", flag);
      prepare_fashion_mnist(dir, split, out, force);
    } else {
      prepare_image_list(input, out, val_fraction, test_fraction, seed, force);
    }
    fmt::print("wrote {}\n", out);
  });
}

void add_prepare_documents(CLI::App& parent) {
  auto* cmd = parent.add_subcommand("prepare-documents",
                                    "Render a synthetic set of numbers and receipts with questions and answers (docs/data.md)");
  static DocumentSetOptions options;
  static std::string out, font = std::string(kDefaultDocumentFont), heldout_font;
  static bool force = false;
  cmd->add_option("--out", out, "Output directory (replaced whole: only an earlier output, unless --force)")->required();
  cmd->add_option("--seed", options.seed, "Seed: the same seed writes the same files");
  cmd->add_option("--train", options.train, "Training documents")->check(CLI::NonNegativeNumber);
  cmd->add_option("--val", options.val, "Validation documents")->check(CLI::NonNegativeNumber);
  cmd->add_option("--test", options.test, "Test documents")->check(CLI::NonNegativeNumber);
  cmd->add_option("--width", options.width, "Image width in pixels")->check(CLI::Range(1, 4096));
  cmd->add_option("--height", options.height, "Image height in pixels")->check(CLI::Range(1, 4096));
  cmd->add_option("--font", font, "TrueType font the documents are drawn in");
  cmd->add_option("--heldout-font", heldout_font,
                  "Also write test-heldout-font.bin: the test documents drawn in this font");
  cmd->add_flag("--force", force, "Replace --out even if it is not an earlier output of this command");
  cmd->callback([] {
    std::vector<std::filesystem::path> inputs = {font};
    if (!heldout_font.empty()) inputs.emplace_back(heldout_font);
    check_replaceable_output(out, "meta.json", inputs, force);
    options.out_dir = out;
    options.font = font;
    options.heldout_font = heldout_font;
    options.show_progress = true;
    const nlohmann::ordered_json meta = prepare_documents(options);
    for (const auto& [name, split] : meta["splits"].items())
      fmt::print("{}: {} records of {}x{}x1\n", name, split["records"].get<uint64_t>(), options.height, options.width);
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
  add_prepare_documents(*cmd);
}

}  // namespace hyla::cli
