#include "hyla/data/image_file.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/data/moonvit_image.h"
#include "hyla/io/file.h"

namespace hyla {

namespace {

// stb_image inflates a PNG's pixel data into a buffer that it doubles as needed, without bound: a
// small file whose data expands to gigabytes passes the dimension check. Every allocation of a
// decode goes through these and is refused past what the checked dimensions can need.
thread_local size_t stbi_allocation_cap = SIZE_MAX;
thread_local bool stbi_allocation_refused = false;

bool allocation_allowed(size_t bytes) {
  if (bytes <= stbi_allocation_cap) return true;
  stbi_allocation_refused = true;
  return false;
}

void* capped_malloc(size_t bytes) { return allocation_allowed(bytes) ? std::malloc(bytes) : nullptr; }
void* capped_realloc(void* p, size_t bytes) { return allocation_allowed(bytes) ? std::realloc(p, bytes) : nullptr; }

}  // namespace

}  // namespace hyla

#define STBI_MALLOC(bytes) ::hyla::capped_malloc(bytes)
#define STBI_REALLOC(p, bytes) ::hyla::capped_realloc(p, bytes)
#define STBI_FREE(p) std::free(p)
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO
#define STB_IMAGE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#include <stb_image.h>
#include <stb_image_write.h>
#pragma GCC diagnostic pop

namespace hyla {

namespace {

// While alive, stb_image may allocate at most `cap` bytes at once.
class AllocationCap {
 public:
  explicit AllocationCap(size_t cap) {
    stbi_allocation_cap = cap;
    stbi_allocation_refused = false;
  }
  ~AllocationCap() { stbi_allocation_cap = SIZE_MAX; }
  AllocationCap(const AllocationCap&) = delete;
  AllocationCap& operator=(const AllocationCap&) = delete;
};

const char* image_kind(std::span<const uint8_t> bytes) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  static constexpr uint8_t kJpeg[3] = {0xFF, 0xD8, 0xFF};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return "PNG";
  if (bytes.size() >= 3 && std::memcmp(bytes.data(), kJpeg, 3) == 0) return "JPEG";
  return nullptr;
}

// stb_image 2.27 (Debian's) builds a JPEG Huffman table without checking that its 16 code counts
// sum to at most 256, and writes past the table when they do. Such tables are refused first: this
// walks the markers as stb_image does (segments by their length, entropy-coded data up to the next
// 0xFF that is not stuffing or a restart) and reads every DHT table as it would, even one that runs
// past its segment. Returns the offending table's count, or 0.
int64_t oversized_jpeg_huffman_table(std::span<const uint8_t> bytes) {
  const auto at = [&](size_t i) -> uint32_t { return i < bytes.size() ? bytes[i] : 0; };  // stb reads 0 past the end
  size_t i = 2;
  while (i + 1 < bytes.size()) {
    const uint32_t marker = bytes[i + 1];
    if (bytes[i] != 0xFF || marker == 0xFF) {
      ++i;
      continue;
    }
    if (marker == 0xD9) break;  // end of image
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {
      i += 2;
      continue;
    }
    const int64_t length = int64_t(at(i + 2) << 8 | at(i + 3));
    if (marker == 0xC4) {
      size_t table = i + 4;
      for (int64_t left = length - 2; left > 0;) {
        int64_t codes = 0;
        for (size_t k = 1; k <= 16; ++k) codes += at(table + k);
        if (codes > 256) return codes;
        table += size_t(17 + codes);
        left -= 17 + codes;
      }
    }
    i += size_t(2 + length);
  }
  return 0;
}

// Alpha over a black background: each colour value scaled by alpha / 255, rounded.
Image drop_alpha(const uint8_t* data, int64_t height, int64_t width, int64_t channels) {
  Image out{height, width, channels - 1, {}};
  const int64_t pixels = height * width;
  out.pixels.resize(size_t(pixels * out.channels));
  for (int64_t p = 0; p < pixels; ++p) {
    const uint8_t* in = data + p * channels;
    const uint32_t alpha = in[channels - 1];
    for (int64_t c = 0; c < out.channels; ++c) out.pixels[size_t(p * out.channels + c)] = uint8_t((in[c] * alpha + 127) / 255);
  }
  return out;
}

Image convert_channels(const Image& image, int64_t channels) {
  if (image.channels == channels) return image;
  const int64_t pixels = image.height * image.width;
  Image out{image.height, image.width, channels, std::vector<uint8_t>(size_t(pixels * channels))};
  const uint8_t* in = image.pixels.data();
  if (channels == 3) {
    for (int64_t p = 0; p < pixels; ++p) std::memset(&out.pixels[size_t(p * 3)], in[p], 3);
  } else {
    // BT.601 luma, in integers so that every platform rounds alike.
    for (int64_t p = 0; p < pixels; ++p)
      out.pixels[size_t(p)] = uint8_t((299 * in[3 * p] + 587 * in[3 * p + 1] + 114 * in[3 * p + 2] + 500) / 1000);
  }
  return out;
}

// Area averaging from `from` to `to` (<= from) pixels along one axis: output i covers source
// [i*from/to, (i+1)*from/to); in units of 1/to pixel every overlap is an integer, so the weights
// are exact and the result does not depend on floating-point rounding.
struct Tap {
  int64_t source, weight;
};
std::vector<std::vector<Tap>> area_taps(int64_t from, int64_t to) {
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(to));
  for (int64_t i = 0; i < to; ++i) {
    const int64_t begin = i * from, end = (i + 1) * from;
    for (int64_t j = begin / to; j * to < end; ++j)
      taps[size_t(i)].push_back({j, std::min(end, (j + 1) * to) - std::max(begin, j * to)});
  }
  return taps;
}

Image downscale(const Image& image, int64_t height, int64_t width) {
  const int64_t C = image.channels;
  const auto rows = area_taps(image.height, height), cols = area_taps(image.width, width);
  // Each row's weights sum to image.width, each column's to image.height.
  std::vector<int64_t> across(size_t(image.height * width * C));
  for (int64_t y = 0; y < image.height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (const Tap& t : cols[size_t(x)])
        for (int64_t c = 0; c < C; ++c)
          across[size_t((y * width + x) * C + c)] += t.weight * image.pixels[size_t((y * image.width + t.source) * C + c)];
  Image out{height, width, C, std::vector<uint8_t>(size_t(height * width * C))};
  const int64_t total = image.height * image.width;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < C; ++c) {
        int64_t sum = 0;
        for (const Tap& t : rows[size_t(y)]) sum += t.weight * across[size_t((t.source * width + x) * C + c)];
        out.pixels[size_t((y * width + x) * C + c)] = uint8_t((sum + total / 2) / total);
      }
  return out;
}

Image pad(Image image, int64_t height, int64_t width) {
  if (image.height == height && image.width == width) return image;
  Image out{height, width, image.channels, std::vector<uint8_t>(size_t(height * width * image.channels))};
  const size_t row = size_t(image.width * image.channels);
  for (int64_t y = 0; y < image.height; ++y)
    std::memcpy(&out.pixels[size_t(y * width * image.channels)], &image.pixels[size_t(y) * row], row);
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Image decode_image(std::span<const uint8_t> bytes, std::string_view source, const ImageLimits& limits) {
  HYLA_CHECK(int64_t(bytes.size()) <= limits.max_bytes && bytes.size() <= size_t(INT_MAX),
             "{}: {} bytes, more than the {} an image file may have", source, bytes.size(), limits.max_bytes);
  const char* kind = image_kind(bytes);
  HYLA_CHECK(kind, "{}: not a PNG or JPEG image", source);
  if (kind == std::string_view("JPEG")) {
    const int64_t codes = oversized_jpeg_huffman_table(bytes);
    HYLA_CHECK(codes == 0, "{}: corrupt JPEG image: a Huffman table of {} codes (at most 256)", source, codes);
  }
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int size = int(bytes.size());
  int width = 0, height = 0, channels = 0;
  HYLA_CHECK(stbi_info_from_memory(data, size, &width, &height, &channels), "{}: corrupt {} image: {}", source, kind,
             stbi_failure_reason());
  HYLA_CHECK(int64_t(width) * height <= limits.max_pixels, "{}: a {}x{} image has {} pixels, more than the limit of {}",
             source, width, height, int64_t(width) * height, limits.max_pixels);
  // The largest buffer a decode needs: 16-bit RGBA rows with their filter bytes, and the inflate
  // buffer's doubling (interlaced PNGs have up to 7 passes of filter bytes).
  const AllocationCap cap(size_t(16 * int64_t(width) * height + 16 * int64_t(height) + (1 << 20)));
  int decoded_width = 0, decoded_height = 0;
  std::unique_ptr<stbi_uc, decltype(&stbi_image_free)> pixels(
      stbi_load_from_memory(data, size, &decoded_width, &decoded_height, &channels, 0), &stbi_image_free);
  if (!pixels) {
    if (stbi_allocation_refused)
      fail("{}: corrupt {} image: its compressed data expands beyond what a {}x{} image holds", source, kind, width,
           height);
    fail("{}: corrupt {} image: {}", source, kind, stbi_failure_reason());
  }
  HYLA_ASSERT(decoded_width == width && decoded_height == height && channels >= 1 && channels <= 4);
  if (channels == 2 || channels == 4) return drop_alpha(pixels.get(), height, width, channels);
  const size_t count = size_t(height) * size_t(width) * size_t(channels);
  return Image{height, width, channels, std::vector<uint8_t>(pixels.get(), pixels.get() + count)};
}

Image read_image_file(const std::filesystem::path& path, const ImageLimits& limits) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  HYLA_CHECK(ec || size <= uintmax_t(limits.max_bytes), "{}: {} bytes, more than the {} an image file may have",
             path.string(), size, limits.max_bytes);
  const std::string bytes = read_file(path);
  return decode_image({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, path.string(), limits);
}

std::string encode_png(const Image& image) {
  HYLA_ASSERT((image.channels == 1 || image.channels == 3) && image.height > 0 && image.width > 0 &&
              image.pixels.size() == size_t(image.height * image.width * image.channels));
  std::string out;
  const auto append = [](void* context, void* data, int bytes) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data), size_t(bytes));
  };
  HYLA_ASSERT(stbi_write_png_to_func(append, &out, int(image.width), int(image.height), int(image.channels),
                                     image.pixels.data(), int(image.width * image.channels)));
  return out;
}

Image to_model_image(const Image& image, const VisionConfig& vision, std::string_view source, bool fit) {
  HYLA_CHECK(vision.enabled,
             "{}: this model reads no images: it has no vision tower (a text GGUF takes one from an mmproj file: "
             "--mmproj FILE)", source);
  if (vision.tower == VisionTower::MoonVit) {  // its processor's rule, which always fits (SPEC §7.2)
    HYLA_CHECK(image.channels == 1 || image.channels == 3, "{}: a {}-channel image; images are grey (1) or RGB (3)",
               source, image.channels);
    Image out = moonvit_model_image(convert_channels(image, 3), vision, source);
    out.source_width = image.source_width ? image.source_width : image.width;
    out.source_height = image.source_height ? image.source_height : image.height;
    return out;
  }
  const int64_t P = vision.patch_size, G = vision.max_grid, side = G * P;
  HYLA_CHECK(P > 0 && G > 0 && (vision.channels == 1 || vision.channels == 3),
             "{}: vision.patch_size {}, vision.max_grid {} and vision.channels {} cannot read an image", source, P, G,
             vision.channels);
  HYLA_CHECK(image.channels == 1 || image.channels == 3, "{}: a {}-channel image; images are grey (1) or RGB (3)",
             source, image.channels);
  HYLA_ASSERT(image.height > 0 && image.width > 0 &&
              image.pixels.size() == size_t(image.height * image.width * image.channels));
  int64_t height = image.height, width = image.width;
  if (fit && (height > side || width > side)) {
    // The longer side becomes `side`, the other keeps the aspect ratio (rounded, at least 1).
    if (height >= width) {
      width = std::max<int64_t>(1, (width * side + height / 2) / height), height = side;
    } else {
      height = std::max<int64_t>(1, (height * side + width / 2) / width), width = side;
    }
  }
  const int64_t rows = ceil_div(height, P), cols = ceil_div(width, P);
  HYLA_CHECK(rows <= G && cols <= G,
             "{}: a {}x{} image needs a {}x{} patch grid; this model reads at most {} x {} patches of {}x{} pixels "
             "(vision.max_grid), i.e. {}x{} pixels",
             source, width, height, rows, cols, G, G, P, P, side, side);
  Image out = convert_channels(image, vision.channels);
  if (height != image.height || width != image.width) out = downscale(out, height, width);
  return pad(std::move(out), rows * P, cols * P);
}

int64_t patch_count(const Image& model_image, const VisionConfig& vision) {
  const int64_t P = vision.position_pixels();
  HYLA_CHECK(P > 0 && model_image.height % P == 0 && model_image.width % P == 0,
             "image of {}x{} pixels is not a whole number of {}x{} patches", model_image.width, model_image.height, P, P);
  return (model_image.height / P) * (model_image.width / P);
}

}  // namespace hyla
