#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/data/image_file.h"
#include "test_util.h"

// Declarations only: the implementation is compiled once, in src/hyla/data/image_file.cpp.
#include <stb_image_write.h>

namespace hyla {
namespace {

using test::expect_error;

std::span<const uint8_t> as_bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

void append(void* context, void* data, int bytes) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), size_t(bytes));
}

// stb_image_write's PNG and JPEG of raw pixels with any channel count (encode_png takes 1 or 3).
std::string png_of(const std::vector<uint8_t>& pixels, int height, int width, int channels) {
  std::string out;
  EXPECT_TRUE(stbi_write_png_to_func(append, &out, width, height, channels, pixels.data(), width * channels));
  return out;
}
std::string jpeg_of(const std::vector<uint8_t>& pixels, int height, int width, int channels) {
  std::string out;
  EXPECT_TRUE(stbi_write_jpg_to_func(append, &out, width, height, channels, pixels.data(), 95));
  return out;
}

Image pattern(int64_t height, int64_t width, int64_t channels) {
  Image image{height, width, channels, std::vector<uint8_t>(size_t(height * width * channels))};
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = uint8_t(i * 37 + 11);
  return image;
}

std::string big_endian(uint32_t v) {
  return {char(v >> 24), char(v >> 16 & 0xFF), char(v >> 8 & 0xFF), char(v & 0xFF)};
}

// A PNG chunk; stb_image does not check CRCs, but the bytes are right anyway.
std::string chunk(const std::string& type, const std::string& data) {
  uLong crc = crc32(0, reinterpret_cast<const Bytef*>(type.data()), uInt(type.size()));
  crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), uInt(data.size()));
  return big_endian(uint32_t(data.size())) + type + data + big_endian(uint32_t(crc));
}

std::string grey_png_header(uint32_t width, uint32_t height) {
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", big_endian(width) + big_endian(height) + std::string("\x08\x00\x00\x00\x00", 5));
}

TEST(ImageFile, PngRoundTripIsExact) {
  for (const Image& image : {pattern(5, 7, 1), pattern(9, 4, 3)}) {
    const std::string png = encode_png(image);
    const Image back = decode_image(as_bytes(png), "pattern.png");
    EXPECT_EQ(back.height, image.height);
    EXPECT_EQ(back.width, image.width);
    EXPECT_EQ(back.channels, image.channels);
    EXPECT_EQ(back.pixels, image.pixels);
  }
  test::TempDir dir;
  const Image image = pattern(3, 2, 3);
  test::write_bytes(dir / "file.png", encode_png(image));
  EXPECT_EQ(read_image_file(dir / "file.png").pixels, image.pixels);
  expect_error([&] { read_image_file(dir / "missing.png"); }, "missing.png: cannot open");
}

TEST(ImageFile, JpegRoundTripIsClose) {
  // stb_image_write's JPEGs are always YCbCr, so an RGB image.
  Image image{16, 24, 3, std::vector<uint8_t>(16 * 24 * 3)};
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 24; ++x)
      for (int c = 0; c < 3; ++c) image.pixels[size_t((y * 24 + x) * 3 + c)] = uint8_t(40 + 5 * x + 3 * y + 20 * c);
  const Image back = decode_image(as_bytes(jpeg_of(image.pixels, 16, 24, 3)), "smooth.jpg");
  ASSERT_EQ(back.channels, 3);
  ASSERT_EQ(back.pixels.size(), image.pixels.size());
  double error = 0;
  for (size_t i = 0; i < image.pixels.size(); ++i) error += std::abs(int(back.pixels[i]) - int(image.pixels[i]));
  EXPECT_LT(error / double(image.pixels.size()), 3.0);
}

TEST(ImageFile, AlphaIsCompositedOverBlack) {
  const Image grey = decode_image(as_bytes(png_of({200, 255, 200, 0, 200, 128}, 1, 3, 2)), "grey-alpha.png");
  EXPECT_EQ(grey.channels, 1);
  EXPECT_EQ(grey.pixels, (std::vector<uint8_t>{200, 0, 100}));  // 200 * 128 / 255 = 100.4
  const Image rgb = decode_image(as_bytes(png_of({10, 20, 255, 255, 90, 180, 255, 0, 255, 255, 255, 51}, 1, 3, 4)), "rgba.png");
  EXPECT_EQ(rgb.channels, 3);
  EXPECT_EQ(rgb.pixels, (std::vector<uint8_t>{10, 20, 255, 0, 0, 0, 51, 51, 51}));
}

TEST(ImageFile, BadBytesAreErrorsNamingTheSource) {
  expect_error([] { decode_image(as_bytes("hello, world"), "notes.txt"); }, "notes.txt: not a PNG or JPEG image");
  expect_error([] { decode_image({}, "empty.png"); }, "empty.png: not a PNG or JPEG image");
  expect_error([] { decode_image(as_bytes(std::string("GIF89a") + std::string(20, '\0')), "a.gif"); },
               "a.gif: not a PNG or JPEG image");
  const std::string png = encode_png(pattern(20, 20, 3));
  // Every cut before the image data ends is refused; none crashes.
  const size_t data_end = png.size() - 12;  // the IEND chunk
  for (size_t cut = 8; cut < data_end; cut += 7)
    expect_error([&] { decode_image(as_bytes(png.substr(0, cut)), "cut.png"); }, "cut.png: corrupt PNG image");
  std::string scrambled = png;
  const size_t idat = scrambled.find("IDAT");
  ASSERT_NE(idat, std::string::npos);
  std::memset(scrambled.data() + idat + 4, 0xFF, 4);  // the zlib header
  expect_error([&] { decode_image(as_bytes(scrambled), "scrambled.png"); }, "scrambled.png: corrupt PNG image");
  expect_error([] { decode_image(as_bytes(std::string("\xFF\xD8\xFF") + std::string(40, 'x')), "junk.jpg"); },
               "junk.jpg: corrupt JPEG image");
  const Image rgb = pattern(16, 16, 3);
  const std::string jpeg = jpeg_of(rgb.pixels, 16, 16, 3);
  // A Huffman table claiming 16 x 255 codes, which stb_image 2.27 would write past its tables.
  std::string codes = jpeg;
  const size_t dht = codes.find("\xFF\xC4");
  ASSERT_NE(dht, std::string::npos);
  std::memset(codes.data() + dht + 5, 0xFF, 16);
  expect_error([&] { decode_image(as_bytes(codes), "codes.jpg"); },
               "codes.jpg: corrupt JPEG image: a Huffman table of 4080 codes (at most 256)");
  for (size_t cut = 3; cut < jpeg.size(); cut += 13) {
    try {
      decode_image(as_bytes(jpeg.substr(0, cut)), "cut.jpg");  // stb fills a cut scan with grey: no error is fine
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("cut.jpg: ", 0), 0u) << e.what();
    }
  }
}

TEST(ImageFile, LimitsAreCheckedBeforeDecoding) {
  // A header promising 20000x20000 pixels and no data: refused by its size, not by the missing data.
  const std::string huge = grey_png_header(20000, 20000) + chunk("IEND", "");
  expect_error([&] { decode_image(as_bytes(huge), "huge.png"); },
               "huge.png: a 20000x20000 image has 400000000 pixels, more than the limit of 16777216");
  const std::string png = encode_png(pattern(10, 10, 1));
  expect_error([&] { decode_image(as_bytes(png), "small.png", {.max_pixels = 99}); },
               "small.png: a 10x10 image has 100 pixels, more than the limit of 99");
  expect_error([&] { decode_image(as_bytes(png), "small.png", {.max_bytes = 40}); },
               "small.png: " + std::to_string(png.size()) + " bytes, more than the 40 an image file may have");
  test::TempDir dir;
  test::write_bytes(dir / "small.png", png);
  expect_error([&] { read_image_file(dir / "small.png", {.max_bytes = 40}); }, "bytes, more than the 40");
  // A 1x1 image whose compressed data inflates to 8 MB: refused once it outgrows what 1x1 needs.
  const std::string zeros(8 << 20, '\0');
  std::string deflated(compressBound(uLong(zeros.size())), '\0');
  uLongf size = uLongf(deflated.size());
  ASSERT_EQ(compress2(reinterpret_cast<Bytef*>(deflated.data()), &size, reinterpret_cast<const Bytef*>(zeros.data()),
                      uLong(zeros.size()), 9),
            Z_OK);
  deflated.resize(size);
  const std::string bomb = grey_png_header(1, 1) + chunk("IDAT", deflated) + chunk("IEND", "");
  expect_error([&] { decode_image(as_bytes(bomb), "bomb.png"); },
               "bomb.png: corrupt PNG image: its compressed data expands beyond what a 1x1 image holds");
}

TEST(ModelImage, ConvertsChannels) {
  const Image rgb{1, 4, 3, {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30}};
  const VisionConfig grey{.enabled = true, .patch_size = 1, .channels = 1, .max_grid = 8};
  EXPECT_EQ(to_model_image(rgb, grey, "rgb").pixels, (std::vector<uint8_t>{76, 150, 29, 18}));  // BT.601 luma
  const VisionConfig colour{.enabled = true, .patch_size = 1, .channels = 3, .max_grid = 8};
  EXPECT_EQ(to_model_image(Image{1, 2, 1, {7, 200}}, colour, "grey").pixels, (std::vector<uint8_t>{7, 7, 7, 200, 200, 200}));
  EXPECT_EQ(to_model_image(rgb, colour, "rgb").pixels, rgb.pixels);
  expect_error([&] { to_model_image(Image{1, 1, 2, {1, 2}}, colour, "two.png"); }, "two.png: a 2-channel image");
  expect_error([&] { to_model_image(rgb, VisionConfig{}, "text-only.png"); },
               "text-only.png: this model reads no images: it has no vision tower (a text GGUF takes one from an "
               "mmproj file: --mmproj FILE)");
}

TEST(ModelImage, PadsBottomAndRightWithZeros) {
  const Image image = pattern(5, 9, 1);
  const VisionConfig vision{.enabled = true, .patch_size = 4, .channels = 1, .max_grid = 8};
  const Image model = to_model_image(image, vision, "padded");
  ASSERT_EQ(model.height, 8);
  ASSERT_EQ(model.width, 12);
  for (int64_t y = 0; y < 8; ++y)
    for (int64_t x = 0; x < 12; ++x)
      EXPECT_EQ(model.pixels[size_t(y * 12 + x)], y < 5 && x < 9 ? image.pixels[size_t(y * 9 + x)] : 0) << y << "," << x;
  EXPECT_EQ(patch_count(model, vision), 6);
  expect_error([&] { patch_count(image, vision); }, "is not a whole number of 4x4 patches");
  // Already whole patches: unchanged, and fit leaves an image that fits alone.
  const Image whole = pattern(28, 28, 1);
  const VisionConfig mnist{.enabled = true, .patch_size = 7, .channels = 1, .max_grid = 8};
  EXPECT_EQ(to_model_image(whole, mnist, "whole", true).pixels, whole.pixels);
}

TEST(ModelImage, FitDownscalesByAreaAveragingKeepingTheAspect) {
  const VisionConfig two{.enabled = true, .patch_size = 1, .channels = 1, .max_grid = 2};
  // Three pixels onto two: each output covers 1.5 source pixels.
  EXPECT_EQ(to_model_image(Image{1, 3, 1, {0, 90, 180}}, two, "row", true).pixels, (std::vector<uint8_t>{30, 150}));
  // 4x4 onto 2x2: each output is the mean of a 2x2 block.
  const Image blocks{4, 4, 1, {0, 2, 100, 100, 4, 6, 100, 100, 50, 50, 255, 255, 50, 50, 255, 254}};
  EXPECT_EQ(to_model_image(blocks, two, "blocks", true).pixels, (std::vector<uint8_t>{3, 100, 50, 255}));
  // 100 tall, 50 wide onto at most 56x56: 56x28, a 8x4 patch grid; a flat image stays flat.
  const VisionConfig mnist{.enabled = true, .patch_size = 7, .channels = 1, .max_grid = 8};
  const Image tall{100, 50, 1, std::vector<uint8_t>(5000, 123)};
  const Image fitted = to_model_image(tall, mnist, "tall.png", true);
  EXPECT_EQ(fitted.height, 56);
  EXPECT_EQ(fitted.width, 28);
  EXPECT_EQ(fitted.pixels, std::vector<uint8_t>(56 * 28, 123));
  EXPECT_EQ(patch_count(fitted, mnist), 32);
  expect_error([&] { to_model_image(tall, mnist, "tall.png"); },
               "tall.png: a 50x100 image needs a 15x8 patch grid; this model reads at most 8 x 8 patches of 7x7 pixels "
               "(vision.max_grid), i.e. 56x56 pixels");
}

}  // namespace
}  // namespace hyla
