#include "hyla/data/moonvit_image.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/error.h"

namespace hyla {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's fixed point for 8-bit images

double pillow_bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One axis's taps, as Pillow's precompute_coeffs and normalize_coeffs_8bpc form them: output index
// o reads [first[o], first[o] + count[o]) with fixed-point weights ksize apart.
struct AxisTaps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
};

AxisTaps axis_taps(int64_t in, int64_t out) {
  const double scale = double(in) / double(out), filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  AxisTaps t;
  t.ksize = int64_t(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out)), t.count.resize(size_t(out));
  t.weights.assign(size_t(out * t.ksize), 0);
  std::vector<double> k(size_t(t.ksize));
  for (int64_t o = 0; o < out; ++o) {
    const double center = (double(o) + 0.5) * scale, ss = 1.0 / filterscale;
    const int64_t lo = std::max<int64_t>(int64_t(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(int64_t(center + support + 0.5), in);
    double total = 0.0;
    for (int64_t x = 0; x < hi - lo; ++x) total += k[size_t(x)] = pillow_bicubic((double(x + lo) - center + 0.5) * ss);
    for (int64_t x = 0; x < hi - lo; ++x) {
      const double w = total != 0.0 ? k[size_t(x)] / total : k[size_t(x)];
      t.weights[size_t(o * t.ksize + x)] = int32_t(w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
    }
    t.first[size_t(o)] = lo, t.count[size_t(o)] = hi - lo;
  }
  return t;
}

uint8_t clip8(int32_t v) {
  if (v >= (1 << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return uint8_t(v >> kPrecisionBits);
}

}  // namespace

MoonVitSize moonvit_size(int64_t width, int64_t height, const VisionConfig& vision) {
  const MoonVitConfig& rules = vision.moonvit;
  const int64_t P = vision.patch_size, side = rules.patch_limit_on_one_side * P;
  const double patches = std::max(1.0, double(width / P)) * std::max(1.0, double(height / P));
  const double scale = std::min({1.0, std::sqrt(double(rules.in_patch_limit) / patches), double(side) / double(width),
                                 double(side) / double(height)});
  MoonVitSize s;
  s.width = std::min(std::max<int64_t>(1, int64_t(double(width) * scale)), side);
  s.height = std::min(std::max<int64_t>(1, int64_t(double(height) * scale)), side);
  const int64_t factor = rules.merge * P;
  s.grid_rows = (s.height + factor - 1) / factor * rules.merge;
  s.grid_cols = (s.width + factor - 1) / factor * rules.merge;
  return s;
}

Image resize_like_pillow_bicubic(const Image& image, int64_t width, int64_t height) {
  HYLA_CHECK(width > 0 && height > 0 && image.width > 0 && image.height > 0, "resize: {}x{} to {}x{}", image.width,
             image.height, width, height);
  const int64_t C = image.channels;
  Image current = image;
  if (width != image.width) {  // the horizontal pass first, as Pillow runs it
    const AxisTaps t = axis_taps(image.width, width);
    Image next{image.height, width, C, std::vector<uint8_t>(size_t(image.height * width * C))};
    for (int64_t y = 0; y < image.height; ++y)
      for (int64_t x = 0; x < width; ++x)
        for (int64_t c = 0; c < C; ++c) {
          int32_t sum = 1 << (kPrecisionBits - 1);
          for (int64_t k = 0; k < t.count[size_t(x)]; ++k)
            sum += int32_t(current.pixels[size_t((y * image.width + t.first[size_t(x)] + k) * C + c)]) *
                   t.weights[size_t(x * t.ksize + k)];
          next.pixels[size_t((y * width + x) * C + c)] = clip8(sum);
        }
    current = std::move(next);
  }
  if (height != image.height) {
    const AxisTaps t = axis_taps(image.height, height);
    Image next{height, width, C, std::vector<uint8_t>(size_t(height * width * C))};
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x)
        for (int64_t c = 0; c < C; ++c) {
          int32_t sum = 1 << (kPrecisionBits - 1);
          for (int64_t k = 0; k < t.count[size_t(y)]; ++k)
            sum += int32_t(current.pixels[size_t(((t.first[size_t(y)] + k) * width + x) * C + c)]) *
                   t.weights[size_t(y * t.ksize + k)];
          next.pixels[size_t((y * width + x) * C + c)] = clip8(sum);
        }
    current = std::move(next);
  }
  return current;
}

Image moonvit_model_image(const Image& rgb, const VisionConfig& vision, std::string_view source) {
  HYLA_CHECK(rgb.channels == 3, "{}: a {}-channel image; the vision tower reads RGB", source, rgb.channels);
  HYLA_CHECK(rgb.width > 0 && rgb.height > 0 && int64_t(rgb.pixels.size()) == rgb.width * rgb.height * 3,
             "{}: an empty or inconsistent {}x{} image", source, rgb.width, rgb.height);
  const MoonVitSize s = moonvit_size(rgb.width, rgb.height, vision);
  const Image resized = resize_like_pillow_bicubic(rgb, s.width, s.height);
  const int64_t P = vision.patch_size;
  Image padded{s.grid_rows * P, s.grid_cols * P, 3, {}};
  padded.pixels.assign(size_t(padded.height * padded.width * 3), 0);
  for (int64_t y = 0; y < s.height; ++y)
    std::copy_n(resized.pixels.begin() + y * s.width * 3, s.width * 3, padded.pixels.begin() + y * padded.width * 3);
  return padded;
}

}  // namespace hyla
