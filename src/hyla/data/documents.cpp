#include "hyla/data/documents.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/data/image_records.h"
#include "hyla/io/file.h"

#define STB_TRUETYPE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb_truetype.h>
#pragma GCC diagnostic pop

namespace hyla {

struct Font::Impl {
  std::string bytes;  // stb_truetype reads the font in place: it lives as long as `info`
  stbtt_fontinfo info{};
  std::string name;
  uint64_t hash = 0;
  int ascent = 0;
};

namespace {

constexpr int kMinPixelHeight = 6;  // below this the glyphs stop being legible
constexpr std::string_view kGlyphsUsed = "0123456789abcdefghijklmnopqrstuvwxyz";

uint32_t big_endian_u32(const std::string& bytes, size_t at) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + at;
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}

// stb_truetype trusts the table directory; a truncated or foreign file must not reach it.
void check_table_directory(const std::string& bytes, const std::string& name) {
  static constexpr char kTags[4][4] = {{0, 1, 0, 0}, {'t', 'r', 'u', 'e'}, {'O', 'T', 'T', 'O'}, {'t', 't', 'c', 'f'}};
  const bool tagged =
      bytes.size() >= 16 && std::any_of(std::begin(kTags), std::end(kTags), [&](const char* tag) {
        return std::memcmp(bytes.data(), tag, 4) == 0;
      });
  HYLA_CHECK(tagged, "{}: not a TrueType or OpenType font", name);
  const int offset = stbtt_GetFontOffsetForIndex(reinterpret_cast<const unsigned char*>(bytes.data()), 0);
  HYLA_CHECK(offset >= 0 && size_t(offset) + 12 <= bytes.size(), "{}: malformed font (no font at index 0)", name);
  const size_t tables = big_endian_u32(bytes, size_t(offset) + 4) >> 16;
  HYLA_CHECK(size_t(offset) + 12 + 16 * tables <= bytes.size(), "{}: truncated font: {} tables do not fit in {} bytes",
             name, tables, bytes.size());
  for (size_t t = 0; t < tables; ++t) {
    const size_t record = size_t(offset) + 12 + 16 * t;
    const uint64_t at = big_endian_u32(bytes, record + 8), length = big_endian_u32(bytes, record + 12);
    HYLA_CHECK(at + length <= bytes.size(), "{}: truncated font: table {} of {} ends at byte {} of {}", name, t,
               tables, at + length, bytes.size());
  }
}

// One line of text laid out at a scale: each glyph's pen position, and the ink's box relative to a
// pen starting at 0 on baseline 0 (y down).
struct Placed {
  int codepoint;
  float x;
};
struct Line {
  std::vector<Placed> glyphs;
  int x0 = INT_MAX, x1 = INT_MIN, y0 = INT_MAX, y1 = INT_MIN;
  int ink_width() const { return x1 > x0 ? x1 - x0 : 0; }
};

Line layout_line(const Font::Impl& font, std::string_view text, float scale) {
  Line line;
  float x = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const int codepoint = static_cast<unsigned char>(text[i]);
    const float origin = std::floor(x);
    int x0, y0, x1, y1;
    stbtt_GetCodepointBitmapBoxSubpixel(&font.info, codepoint, scale, scale, x - origin, 0, &x0, &y0, &x1, &y1);
    if (x1 > x0 && y1 > y0) {
      line.x0 = std::min(line.x0, int(origin) + x0), line.x1 = std::max(line.x1, int(origin) + x1);
      line.y0 = std::min(line.y0, y0), line.y1 = std::max(line.y1, y1);
    }
    line.glyphs.push_back({codepoint, x});
    int advance, left_bearing;
    stbtt_GetCodepointHMetrics(&font.info, codepoint, &advance, &left_bearing);
    x += scale * float(advance);
    if (i + 1 < text.size())
      x += scale * float(stbtt_GetCodepointKernAdvance(&font.info, codepoint, static_cast<unsigned char>(text[i + 1])));
  }
  return line;
}

// Draws a laid-out line with its pen starting at (x, baseline); overlapping glyphs keep the brighter value.
void draw_line(const Font::Impl& font, const Line& line, float scale, int x, int baseline, Image& image) {
  std::vector<uint8_t> glyph;
  for (const Placed& g : line.glyphs) {
    const float origin = std::floor(g.x), shift = g.x - origin;
    int x0, y0, x1, y1;
    stbtt_GetCodepointBitmapBoxSubpixel(&font.info, g.codepoint, scale, scale, shift, 0, &x0, &y0, &x1, &y1);
    const int w = x1 - x0, h = y1 - y0;
    if (w <= 0 || h <= 0) continue;
    glyph.assign(size_t(w) * size_t(h), 0);
    stbtt_MakeCodepointBitmapSubpixel(&font.info, glyph.data(), w, h, w, scale, scale, shift, 0, g.codepoint);
    const int left = x + int(origin) + x0, top = baseline + y0;
    // Layout keeps the text inside for fonts whose glyphs stay within their ascent and descent.
    HYLA_CHECK(left >= 0 && top >= 0 && left + w <= image.width && top + h <= image.height,
               "{}: the glyph '{}' reaches outside the {}x{} document (it is drawn beyond the font's ascent or "
               "descent); choose another font", font.name, char(g.codepoint), image.width, image.height);
    for (int r = 0; r < h; ++r)
      for (int c = 0; c < w; ++c) {
        uint8_t& out = image.pixels[size_t((top + r) * image.width + left + c)];
        out = std::max(out, glyph[size_t(r * w + c)]);
      }
  }
}

float scale_for(const Font::Impl& font, int pixel_height) {
  return stbtt_ScaleForPixelHeight(&font.info, float(pixel_height));
}

// The largest pixel height up to `largest` at which every one of `lines` is at most `room` pixels
// wide, or an error naming the widest.
int fit_pixel_height(const Font::Impl& font, const std::vector<std::string>& lines, int largest, int room,
                     std::string_view what, int64_t width, int64_t height) {
  int px = largest;
  while (px >= kMinPixelHeight) {
    int widest = 0;
    for (const std::string& text : lines) widest = std::max(widest, layout_line(font, text, scale_for(font, px)).ink_width());
    if (widest <= room) return px;
    px = std::min(px - 1, int(int64_t(px) * room / widest));
  }
  const auto widest = std::max_element(lines.begin(), lines.end(), [&](const std::string& a, const std::string& b) {
    return layout_line(font, a, 1).ink_width() < layout_line(font, b, 1).ink_width();
  });
  fail("{}: a {}x{} document cannot hold {} '{}' at {} pixels or more; choose a larger width or height",
       font.name, width, height, what, widest == lines.end() ? "" : *widest, kMinPixelHeight);
}

char widest_digit(const Font::Impl& font) {
  char widest = '0';
  int widest_advance = 0;
  for (char d = '0'; d <= '9'; ++d) {
    int advance, left_bearing;
    stbtt_GetCodepointHMetrics(&font.info, d, &advance, &left_bearing);
    if (advance > widest_advance) widest_advance = advance, widest = d;
  }
  return widest;
}

int margin_of(int64_t width, int64_t height) { return int(std::max<int64_t>(1, std::min(width, height) / 32)); }
int line_pitch(int px) { return px + std::max(1, px / 4); }

// One size for every receipt of a font and image size: the largest at which four lines (three
// items and the total) fit the height and the widest line any receipt can have fits the width.
int receipt_pixel_height(const Font::Impl& font, int64_t width, int64_t height) {
  const int margin = margin_of(width, height), room = int(height) - 2 * margin;
  int px = std::max(0, room / 4);
  while (px > 0 && 3 * line_pitch(px) + px > room) --px;
  if (px < kMinPixelHeight)
    fail("{}: a {}x{} document cannot hold four lines of receipt text at {} pixels or more; choose a larger height",
         font.name, width, height, kMinPixelHeight);
  const char digit = widest_digit(font);
  std::vector<std::string> widest_lines = {"total " + std::string(3, digit)};
  for (std::string_view item : kReceiptItems) widest_lines.push_back(fmt::format("{} {}{}", item, digit, digit));
  return fit_pixel_height(font, widest_lines, px, int(width) - 2 * margin, "receipt lines such as", width, height);
}

int number_pixel_height(const Font::Impl& font, const std::string& number, int64_t width, int64_t height) {
  const int margin = margin_of(width, height);
  const int largest = std::min(int(height) / 2, int(height) - 2 * margin);
  return fit_pixel_height(font, {number}, largest, int(width) - 2 * margin, "the number", width, height);
}

// Fails now, before anything is written, if some document of the set would not fit.
void check_documents_fit(const Font::Impl& font, int64_t width, int64_t height) {
  receipt_pixel_height(font, width, height);
  number_pixel_height(font, std::string(6, widest_digit(font)), width, height);
}

std::string random_number(Rng& rng) {
  const uint64_t digits = 1 + rng.below(6);
  uint64_t low = 1;
  for (uint64_t d = 1; d < digits; ++d) low *= 10;
  const uint64_t first = digits == 1 ? 0 : low;
  return std::to_string(first + rng.below(low * 10 - first));
}

// A document's split: 0 train, 1 val, 2 test, from a hash of its text, so that two splits never
// hold the same image whatever the seeds and counts.
int split_of(const Document& document) {
  std::string text;
  for (const std::string& line : document.lines) text += line + "\n";
  const uint64_t bucket = hash_string(text) % 16;
  return bucket == 0 ? 2 : bucket == 1 ? 1 : 0;
}

void add_record(ImageRecordWriter& writer, const Document& document, const Font& font, int64_t width, int64_t height) {
  const Image image = render_document(document, font, width, height);
  writer.add(image.pixels, int32_t(height), int32_t(width), 1, document.question + document.answer,
             int32_t(document.type), int32_t(document.question.size()));
}

nlohmann::ordered_json font_meta(const Font& font) {
  return {{"file", font.name()}, {"fnv1a64", fmt::format("{:016x}", font.hash())}};
}

}  // namespace

Document make_document(Rng& rng, QuestionType type) {
  Document document;
  document.type = type;
  if (type == QuestionType::Number) {
    const std::string number = random_number(rng);
    document.lines = {number};
    document.question = "Q: what number is written? A:";
    document.answer = " " + number;
    return document;
  }
  // Distinct items and distinct prices (a partial shuffle), so every question has one answer.
  const size_t count = 2 + rng.below(2);
  std::array<size_t, kReceiptItems.size()> items;
  std::iota(items.begin(), items.end(), 0);
  std::array<int, 99> prices;
  std::iota(prices.begin(), prices.end(), 1);
  int total = 0;
  for (size_t i = 0; i < count; ++i) {
    std::swap(items[i], items[i + rng.below(items.size() - i)]);
    std::swap(prices[i], prices[i + rng.below(prices.size() - i)]);
    document.lines.push_back(fmt::format("{} {}", kReceiptItems[items[i]], prices[i]));
    total += prices[i];
  }
  document.lines.push_back(fmt::format("total {}", total));
  const size_t asked = rng.below(count);
  switch (type) {
    case QuestionType::Total:
      document.question = "Q: what is the total? A:";
      document.answer = fmt::format(" {}", total);
      break;
    case QuestionType::WhichItem:
      document.question = fmt::format("Q: which item costs {}? A:", prices[asked]);
      document.answer = fmt::format(" {}", kReceiptItems[items[asked]]);
      break;
    case QuestionType::PriceOf:
      document.question = fmt::format("Q: how much is the {}? A:", kReceiptItems[items[asked]]);
      document.answer = fmt::format(" {}", prices[asked]);
      break;
    case QuestionType::Number:
      break;
  }
  return document;
}

Font Font::load(const std::filesystem::path& path) {
  auto impl = std::make_shared<Impl>();
  impl->name = path.filename().string();
  impl->bytes = read_file(path);
  check_table_directory(impl->bytes, path.string());
  const auto* data = reinterpret_cast<const unsigned char*>(impl->bytes.data());
  HYLA_CHECK(stbtt_InitFont(&impl->info, data, stbtt_GetFontOffsetForIndex(data, 0)),
             "{}: malformed font (stb_truetype cannot read its tables)", path.string());
  for (char c : kGlyphsUsed)
    HYLA_CHECK(stbtt_FindGlyphIndex(&impl->info, c) != 0, "{}: the font has no glyph for '{}'", path.string(), c);
  int descent, line_gap;
  stbtt_GetFontVMetrics(&impl->info, &impl->ascent, &descent, &line_gap);
  impl->hash = hash_string(impl->bytes);
  Font font;
  font.impl_ = std::move(impl);
  return font;
}

const std::string& Font::name() const { return impl_->name; }
uint64_t Font::hash() const { return impl_->hash; }

Image render_document(const Document& document, const Font& font, int64_t width, int64_t height) {
  HYLA_CHECK(width >= 1 && height >= 1 && width <= 4096 && height <= 4096,
             "documents are 1 to 4096 pixels on each side, not {}x{}", width, height);
  const Font::Impl& f = font.impl();
  Image image{height, width, 1, std::vector<uint8_t>(size_t(width * height), 0)};
  const int margin = margin_of(width, height);
  if (document.type == QuestionType::Number) {
    const float scale = scale_for(f, number_pixel_height(f, document.lines.at(0), width, height));
    const Line line = layout_line(f, document.lines.at(0), scale);
    draw_line(f, line, scale, (int(width) - line.ink_width()) / 2 - line.x0,
              (int(height) - (line.y1 - line.y0)) / 2 - line.y0, image);
    return image;
  }
  const int px = receipt_pixel_height(f, width, height);
  const float scale = scale_for(f, px);
  const int first_baseline = margin + int(std::lround(float(f.ascent) * scale));
  for (size_t i = 0; i < document.lines.size(); ++i) {
    const Line line = layout_line(f, document.lines[i], scale);
    draw_line(f, line, scale, margin - line.x0, first_baseline + int(i) * line_pitch(px), image);
  }
  return image;
}

nlohmann::ordered_json prepare_documents(const DocumentSetOptions& options) {
  HYLA_CHECK(options.train >= 0 && options.val >= 0 && options.test >= 0,
             "document counts must not be negative (train {}, val {}, test {})", options.train, options.val, options.test);
  const Font font = Font::load(options.font);
  std::optional<Font> heldout;
  if (!options.heldout_font.empty()) heldout = Font::load(options.heldout_font);
  HYLA_CHECK(options.width >= 1 && options.height >= 1 && options.width <= 4096 && options.height <= 4096,
             "documents are 1 to 4096 pixels on each side, not {}x{}", options.width, options.height);
  for (const Font* f : {&font, heldout ? &*heldout : &font}) check_documents_fit(f->impl(), options.width, options.height);
  AtomicDirectory directory(options.out_dir);
  nlohmann::ordered_json meta = {{"format", "hyla-image-records"},
                                 {"version", kImageRecordsVersion},
                                 {"dataset", "documents"},
                                 {"generator", kDocumentGenerator},
                                 {"seed", options.seed},
                                 {"width", options.width},
                                 {"height", options.height},
                                 {"channels", 1},
                                 {"font", font_meta(font)}};
  if (heldout) meta["heldout_font"] = font_meta(*heldout);
  meta["question_types"] = kQuestionTypes;
  std::optional<Progress> progress;
  if (options.show_progress)
    progress.emplace("documents", uint64_t(options.train + options.val + options.test), "documents");
  const auto split_meta = [&](const std::string& file, uint64_t records) {
    return nlohmann::ordered_json{{"file", file}, {"records", records}, {"height", options.height},
                                  {"width", options.width}, {"channels", 1}};
  };
  const std::pair<std::string, int64_t> splits[3] = {{"train", options.train}, {"val", options.val}, {"test", options.test}};
  for (int s = 0; s < 3; ++s) {
    const auto& [name, count] = splits[s];
    Rng rng(hash_string(fmt::format("{} seed {} split {}", kDocumentGenerator, options.seed, name)));
    ImageRecordWriter writer(directory.temp() / (name + ".bin"));
    std::optional<ImageRecordWriter> heldout_writer;
    if (heldout && name == "test") heldout_writer.emplace(directory.temp() / "test-heldout-font.bin");
    while (int64_t(writer.count()) < count) {
      const Document document = make_document(rng, QuestionType(rng.below(kQuestionTypes.size())));
      if (split_of(document) != s) continue;
      add_record(writer, document, font, options.width, options.height);
      if (heldout_writer) add_record(*heldout_writer, document, *heldout, options.width, options.height);
      if (progress) progress->advance(1);
    }
    writer.commit();
    meta["splits"][name] = split_meta(name + ".bin", writer.count());
    if (heldout_writer) {
      heldout_writer->commit();
      meta["splits"]["test-heldout-font"] = split_meta("test-heldout-font.bin", heldout_writer->count());
    }
  }
  if (progress) progress->finish();
  write_file_atomic(directory.temp() / "meta.json", meta.dump(2) + "\n");
  directory.commit();
  return meta;
}

}  // namespace hyla
