#pragma once
// A synthetic set of formatted documents for visual question answering (`hyla data
// prepare-documents`): numbers and small receipts rendered with a TrueType font (stb_truetype),
// grey, white text (255) on black (0) like Fashion-MNIST, each with a question and its answer.
// Everything is a function of the seed: the same seed writes byte-identical files.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/core/random.h"

namespace hyla {

// Changes whenever the same seed would produce other documents or pixels.
inline constexpr std::string_view kDocumentGenerator = "hyla-documents-1";
inline constexpr std::string_view kDefaultDocumentFont = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

// A record's label is the question type's index.
enum class QuestionType : int32_t { Number = 0, Total = 1, WhichItem = 2, PriceOf = 3 };
inline constexpr std::array<std::string_view, 4> kQuestionTypes = {"number", "total", "which-item", "price-of"};
// The receipt items: short words, so that a 64-pixel line holds one with its price.
inline constexpr std::array<std::string_view, 12> kReceiptItems = {"tea", "pie", "jam", "egg", "ham", "oil",
                                                                   "nut", "fig", "bun", "cod", "yam", "gum"};

struct Document {
  QuestionType type = QuestionType::Number;
  // The text drawn, top to bottom: one line (the number, drawn large) or a receipt's 2-3 "item
  // price" lines (distinct items, distinct prices 1-99) and "total N".
  std::vector<std::string> lines;
  std::string question;  // "Q: what is the total? A:", ending where the answer follows
  std::string answer;    // " 57"
};

// A random document and question of `type`: a 1-6 digit number (digit count uniform, then the
// value), or a receipt.
Document make_document(Rng& rng, QuestionType type);

// A TrueType (or OpenType) font file, loaded whole.
class Font {
 public:
  // Errors name the file: missing, not a font, a malformed table directory, or no glyph for a
  // character documents use. stb_truetype does not bounds-check glyph data: fonts are trusted input.
  static Font load(const std::filesystem::path& path);
  const std::string& name() const;  // the file name, for meta.json
  uint64_t hash() const;            // FNV-1a of the file's bytes

  struct Impl;  // defined in documents.cpp, holding stb_truetype's state
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// The document as a width x height grey image. A number is centred, as large as fits (at most
// half the height); receipts are left-aligned at one size for every receipt of this font and
// image size (the largest at which four of the widest possible lines fit). An error if the image
// cannot hold the text legibly.
Image render_document(const Document& document, const Font& font, int64_t width, int64_t height);

struct DocumentSetOptions {
  std::filesystem::path out_dir;
  std::filesystem::path font{kDefaultDocumentFont};
  std::filesystem::path heldout_font;  // empty: none
  uint64_t seed = 0;
  int64_t train = 10000, val = 1000, test = 1000;
  int64_t width = 64, height = 64;
  bool show_progress = false;
};

// Writes out_dir atomically (replaced whole or not at all): train.bin, val.bin, test.bin (image
// records, caption = question + answer with the question as the prompt, label = question type),
// test-heldout-font.bin when heldout_font is set (the test documents in that font) and meta.json,
// which it returns. Question types are drawn uniformly. A document's split is a function of its
// text (a hash), so no image of one split appears in another; each split draws from its own
// random stream, keeping the documents that belong to it.
nlohmann::ordered_json prepare_documents(const DocumentSetOptions& options);

}  // namespace hyla
