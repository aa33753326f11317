// Kimi K2.5's and K3's image processing (SPEC §7.2): Pillow's bicubic resize to the byte (fixture
// written by Pillow), the size rule, and the patches' layout and normalisation.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "hyla/core/error.h"
#include "hyla/data/moonvit_image.h"
#include "hyla/io/base64.h"
#include "hyla/model/moonvit.h"
#include "test_util.h"

namespace hyla {
namespace {

Image rgb_image(int64_t width, int64_t height, const std::vector<uint8_t>& bytes) {
  return Image{height, width, 3, bytes};
}

TEST(MoonVitImage, ResizesAsPillowDoesToTheByte) {
  std::ifstream in(test::source_dir() / "tests/data/pillow_bicubic.json");
  ASSERT_TRUE(in);
  const nlohmann::json j = nlohmann::json::parse(in);
  const Image source = rgb_image(j["width"], j["height"], base64_decode(j["rgb"].get<std::string>(), "fixture"));
  for (const auto& c : j["cases"]) {
    const int64_t w = c["width"], h = c["height"];
    SCOPED_TRACE(std::to_string(w) + "x" + std::to_string(h));
    const Image got = resize_like_pillow_bicubic(source, w, h);
    ASSERT_EQ(got.width, w);
    ASSERT_EQ(got.height, h);
    EXPECT_EQ(got.pixels, base64_decode(c["rgb"].get<std::string>(), "fixture"));
  }
}

VisionConfig kimi_vision(int64_t patch_size = 14) {
  VisionConfig v;
  v.enabled = true, v.tower = VisionTower::MoonVit, v.patch_size = patch_size, v.channels = 3;
  return v;
}

TEST(MoonVitImage, SizeRuleNeverUpscalesAndBoundsThePatches) {
  const VisionConfig rules = kimi_vision();
  // Small enough: kept, padded to whole 28-pixel windows.
  MoonVitSize s = moonvit_size(100, 60, rules);
  EXPECT_EQ(s.width, 100);
  EXPECT_EQ(s.height, 60);
  EXPECT_EQ(s.grid_cols, 8);  // 100 → 112 pixels
  EXPECT_EQ(s.grid_rows, 6);  // 60 → 84
  EXPECT_EQ(s.tokens(2), 12);
  // A 1×1 image: one merge window of padding around one pixel.
  s = moonvit_size(1, 1, rules);
  EXPECT_EQ(s.width, 1);
  EXPECT_EQ(s.grid_rows, 2);
  EXPECT_EQ(s.grid_cols, 2);
  // 20,000 × 20,000: scaled by sqrt(16384 / 1428²), 1428 patches a side → about 128.
  s = moonvit_size(20000, 20000, rules);
  EXPECT_EQ(s.width, int64_t(20000 * std::sqrt(16384.0 / (1428.0 * 1428.0))));
  EXPECT_LE(s.grid_rows * s.grid_cols, 16384 + 2 * 130);
  // A long strip: bounded by 512 patches a side.
  s = moonvit_size(100000, 20, rules);
  EXPECT_LE(s.width, 512 * 14);
}

TEST(MoonVitImage, PatchesAreChannelFirstNormalisedAndPaddedWithBlack) {
  const VisionConfig vision = kimi_vision(2);
  // 3×2 pixels: resized to itself, padded to 4×4 (grid 2×2 patches of 2×2).
  std::vector<uint8_t> px;
  for (int i = 0; i < 3 * 2 * 3; ++i) px.push_back(uint8_t(i * 10));
  const Image model_image = moonvit_model_image(rgb_image(3, 2, px), vision, "test");
  ASSERT_EQ(model_image.width, 4);
  ASSERT_EQ(model_image.height, 4);
  std::vector<float> p(size_t(4 * 12), NAN);
  const TowerImage grid = moonvit_patchify(model_image, vision, "test", p.data());
  ASSERT_EQ(grid.grid_rows, 2);
  ASSERT_EQ(grid.grid_cols, 2);
  auto value = [](uint8_t v) { return float((v / 255.0 - 0.5) * 2.0); };
  // Patch (0, 0), channel 1, pixel (y 1, x 0) is source pixel (1, 0): index (1·3 + 0)·3 + 1.
  EXPECT_FLOAT_EQ(p[size_t(1 * 4 + 1 * 2 + 0)], value(px[(1 * 3 + 0) * 3 + 1]));
  // Patch (0, 1), channel 2, pixel (0, 0) is source (0, 2); its pixel (0, 1) is padding: −1.
  EXPECT_FLOAT_EQ(p[size_t(12 + 2 * 4 + 0)], value(px[(0 * 3 + 2) * 3 + 2]));
  EXPECT_FLOAT_EQ(p[size_t(12 + 2 * 4 + 1)], -1.0f);
  // Patch (1, 0) is all padding.
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(p[size_t(24 + i)], -1.0f);
}

TEST(MoonVitImage, RefusesAnImageThatIsNotRgbOrNotWholeWindows) {
  const Image grey{4, 4, 1, std::vector<uint8_t>(16)};
  EXPECT_THROW(moonvit_model_image(grey, kimi_vision(2), "grey.png"), Error);
  const Image odd{4, 6, 3, std::vector<uint8_t>(72)};
  std::vector<float> out(1000);
  EXPECT_THROW(moonvit_patchify(odd, kimi_vision(2), "odd.png", out.data()), Error);
}

}  // namespace
}  // namespace hyla
