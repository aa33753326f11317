#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/data/documents.h"
#include "hyla/data/image_records.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "test_util.h"

namespace hyla {
namespace {

using test::expect_error;

namespace fs = std::filesystem;

const fs::path kFonts = "/usr/share/fonts/truetype/dejavu";

// scripts/setup.sh installs fonts-dejavu-core: a missing font is a broken setup, not a skip.
#define REQUIRE_FONTS()                                                                          \
  ASSERT_TRUE(fs::exists(kFonts / "DejaVuSerif.ttf") && fs::exists(kFonts / "DejaVuSansMono.ttf")) \
      << "fonts-dejavu-core is not installed (scripts/setup.sh installs it)"

// "jam 12" -> {"jam", 12}
std::pair<std::string, int> item_and_price(const std::string& line) {
  const size_t space = line.find(' ');
  return {line.substr(0, space), std::stoi(line.substr(space + 1))};
}

TEST(Documents, ReceiptsAddUpAndEveryQuestionHasOneAnswer) {
  Rng rng(7);
  for (QuestionType type : {QuestionType::Total, QuestionType::WhichItem, QuestionType::PriceOf}) {
    for (int n = 0; n < 500; ++n) {
      const Document d = make_document(rng, type);
      ASSERT_TRUE(d.lines.size() == 3 || d.lines.size() == 4) << d.lines.size();
      std::map<std::string, int> prices;
      std::set<int> distinct_prices;
      int sum = 0;
      for (size_t i = 0; i + 1 < d.lines.size(); ++i) {
        const auto [item, price] = item_and_price(d.lines[i]);
        EXPECT_NE(std::find(kReceiptItems.begin(), kReceiptItems.end(), item), kReceiptItems.end()) << item;
        EXPECT_GE(price, 1);
        EXPECT_LE(price, 99);
        prices[item] = price;
        distinct_prices.insert(price);
        sum += price;
      }
      EXPECT_EQ(prices.size(), d.lines.size() - 1) << "items are distinct";
      EXPECT_EQ(distinct_prices.size(), d.lines.size() - 1) << "prices are distinct";
      EXPECT_EQ(d.lines.back(), "total " + std::to_string(sum));
      EXPECT_EQ(d.question.substr(0, 3), "Q: ");
      EXPECT_EQ(d.question.substr(d.question.size() - 3), " A:");
      ASSERT_EQ(d.answer[0], ' ');
      const std::string answer = d.answer.substr(1);
      if (type == QuestionType::Total) {
        EXPECT_EQ(d.question, "Q: what is the total? A:");
        EXPECT_EQ(answer, std::to_string(sum));
      } else if (type == QuestionType::WhichItem) {
        const int asked = std::stoi(d.question.substr(std::string("Q: which item costs ").size()));
        int matches = 0;
        for (const auto& [item, price] : prices) matches += price == asked;
        EXPECT_EQ(matches, 1) << d.question;
        EXPECT_EQ(prices.at(answer), asked) << d.question << answer;
      } else {
        const std::string prefix = "Q: how much is the ";
        const std::string item = d.question.substr(prefix.size(), d.question.size() - prefix.size() - 4);
        EXPECT_EQ(d.question, prefix + item + "? A:");
        EXPECT_EQ(std::to_string(prices.at(item)), answer);
      }
    }
  }
}

TEST(Documents, NumbersHaveOneToSixDigits) {
  Rng rng(3);
  std::set<size_t> lengths;
  for (int n = 0; n < 300; ++n) {
    const Document d = make_document(rng, QuestionType::Number);
    ASSERT_EQ(d.lines.size(), 1u);
    const std::string& number = d.lines[0];
    lengths.insert(number.size());
    EXPECT_TRUE(number == "0" || number[0] != '0') << number;
    EXPECT_EQ(number.find_first_not_of("0123456789"), std::string::npos) << number;
    EXPECT_EQ(d.question, "Q: what number is written? A:");
    EXPECT_EQ(d.answer, " " + number);
  }
  EXPECT_EQ(lengths, (std::set<size_t>{1, 2, 3, 4, 5, 6}));
}

int64_t lit_pixels(const Image& image) {
  return std::count_if(image.pixels.begin(), image.pixels.end(), [](uint8_t v) { return v > 128; });
}

TEST(Documents, RenderedTextFitsAndDiffersBetweenFonts) {
  REQUIRE_FONTS();
  const Font sans = Font::load(kFonts / "DejaVuSans.ttf"), serif = Font::load(kFonts / "DejaVuSerif.ttf"),
             mono = Font::load(kFonts / "DejaVuSansMono.ttf");
  EXPECT_EQ(sans.name(), "DejaVuSans.ttf");
  Rng rng(11);
  for (int n = 0; n < 200; ++n) {
    const Document d = make_document(rng, QuestionType(n % 4));
    // Every glyph lands inside the image (render_document checks) in each font.
    for (const Font* font : {&sans, &serif, &mono}) {
      const Image image = render_document(d, *font, 64, 64);
      ASSERT_EQ(image.channels, 1);
      ASSERT_EQ(image.pixels.size(), 64u * 64u);
      EXPECT_GT(lit_pixels(image), 20) << font->name() << " " << d.lines[0];
    }
    EXPECT_NE(render_document(d, sans, 64, 64).pixels, render_document(d, serif, 64, 64).pixels);
  }
  // A receipt's text starts in the top left, leaving the bottom right dark.
  Document receipt{QuestionType::Total, {"tea 5", "jam 7", "total 12"}, "", ""};
  const Image image = render_document(receipt, sans, 64, 64);
  EXPECT_EQ(image.pixels[0], 0);
  int64_t bottom_right = 0;
  for (int64_t y = 48; y < 64; ++y)
    for (int64_t x = 40; x < 64; ++x) bottom_right += image.pixels[size_t(y * 64 + x)];
  EXPECT_EQ(bottom_right, 0);
  // Larger images hold larger text.
  EXPECT_GT(lit_pixels(render_document(receipt, sans, 128, 128)), 2 * lit_pixels(image));
}

TEST(Documents, ImagesTooSmallAndBadFontsAreErrors) {
  REQUIRE_FONTS();
  const Font sans = Font::load(kFonts / "DejaVuSans.ttf");
  Rng rng(1);
  const Document receipt = make_document(rng, QuestionType::Total);
  expect_error([&] { render_document(receipt, sans, 24, 64); }, "DejaVuSans.ttf: a 24x64 document cannot hold receipt lines");
  expect_error([&] { render_document(receipt, sans, 64, 20); }, "a 64x20 document cannot hold four lines of receipt text");
  const Document number{QuestionType::Number, {"123456"}, "", ""};
  expect_error([&] { render_document(number, sans, 20, 64); }, "a 20x64 document cannot hold the number '123456'");
  test::TempDir dir;
  expect_error([&] { Font::load(dir / "missing.ttf"); }, "missing.ttf: cannot open");
  test::write_bytes(dir / "text.ttf", "this is not a font at all");
  expect_error([&] { Font::load(dir / "text.ttf"); }, "text.ttf: not a TrueType or OpenType font");
  test::write_bytes(dir / "cut.ttf", read_file(kFonts / "DejaVuSans.ttf").substr(0, 4000));
  expect_error([&] { Font::load(dir / "cut.ttf"); }, "cut.ttf: truncated font");
}

std::vector<std::string> record_keys(const fs::path& file) {
  const ImageRecordReader reader(file);
  std::vector<std::string> keys;
  for (uint64_t i = 0; i < reader.size(); ++i) {
    const ImageRecord r = reader.record(i);
    keys.emplace_back(reinterpret_cast<const char*>(r.pixels.data()), r.pixels.size());
  }
  return keys;
}

TEST(Documents, SameSeedSameBytesAndDisjointSplits) {
  REQUIRE_FONTS();
  test::TempDir dir;
  DocumentSetOptions options;
  options.train = 120, options.val = 20, options.test = 20, options.seed = 5;
  options.heldout_font = kFonts / "DejaVuSerif.ttf";
  options.out_dir = dir / "a";
  const auto meta = prepare_documents(options);
  options.out_dir = dir / "b";
  prepare_documents(options);
  options.out_dir = dir / "c";
  options.seed = 6;
  prepare_documents(options);
  for (const char* file : {"train.bin", "val.bin", "test.bin", "test-heldout-font.bin", "meta.json"})
    EXPECT_EQ(read_file(dir / "a" / file), read_file(dir / "b" / file)) << file;
  EXPECT_NE(read_file(dir / "a" / "train.bin"), read_file(dir / "c" / "train.bin"));

  EXPECT_EQ(meta["generator"], kDocumentGenerator);
  EXPECT_EQ(meta["font"]["file"], "DejaVuSans.ttf");
  EXPECT_EQ(meta["heldout_font"]["file"], "DejaVuSerif.ttf");
  EXPECT_EQ(meta["question_types"], nlohmann::json({"number", "total", "which-item", "price-of"}));
  EXPECT_EQ(meta["splits"]["test-heldout-font"]["records"], 20);
  EXPECT_EQ(parse_json_file((dir / "a" / "meta.json").string())["splits"]["val"]["records"], 20);

  const ImageRecordReader train(dir / "a" / "train.bin"), test(dir / "a" / "test.bin"),
      heldout(dir / "a" / "test-heldout-font.bin");
  ASSERT_EQ(train.size(), 120u);
  std::set<int32_t> labels;
  for (uint64_t i = 0; i < train.size(); ++i) {
    const ImageRecord r = train.record(i);
    EXPECT_EQ(r.height, 64);
    EXPECT_EQ(r.channels, 1);
    labels.insert(r.label);
    const std::string_view prompt = r.caption.substr(0, size_t(r.prompt_bytes));
    EXPECT_EQ(prompt.substr(0, 3), "Q: ");
    EXPECT_EQ(prompt.substr(prompt.size() - 3), " A:");
  }
  EXPECT_EQ(labels, (std::set<int32_t>{0, 1, 2, 3}));
  // The held-out font draws the same documents: same captions, other pixels.
  for (uint64_t i = 0; i < test.size(); ++i) {
    EXPECT_EQ(test.record(i).caption, heldout.record(i).caption);
    EXPECT_NE(record_keys(dir / "a" / "test.bin")[i], record_keys(dir / "a" / "test-heldout-font.bin")[i]);
  }
  // No image of one split appears in another, for either seed.
  std::set<std::string> seen;
  for (const char* split : {"train.bin", "val.bin", "test.bin"}) {
    std::set<std::string> here;
    for (const char* run : {"a", "c"})
      for (const std::string& key : record_keys(dir / run / split)) here.insert(key);
    for (const std::string& key : here) EXPECT_FALSE(seen.count(key)) << split;
    seen.insert(here.begin(), here.end());
  }
}

TEST(Documents, PrepareDocumentsCommand) {
  REQUIRE_FONTS();
  test::TempDir dir;
  const fs::path out = dir / "docs";
  auto r = test::run_hyla("data prepare-documents --out " + out.string() +
                          " --train 8 --val 2 --test 2 --width 72 --height 64 --seed 1 --heldout-font " +
                          (kFonts / "DejaVuSansMono.ttf").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test-heldout-font: 2 records of 64x72x1"), std::string::npos) << r.output;
  EXPECT_EQ(ImageRecordReader(out / "val.bin").record(0).width, 72);
  r = test::run_hyla("data prepare-documents --out " + (dir / "bad").string() + " --font " + (dir / "none.ttf").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("none.ttf: cannot open"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "bad"));
  r = test::run_hyla("data prepare-documents --out " + (dir / "small").string() + " --width 20 --train 2 --val 0 --test 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("document cannot hold"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "small"));
}

}  // namespace
}  // namespace hyla
