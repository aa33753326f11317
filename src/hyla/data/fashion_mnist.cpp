#include "hyla/data/fashion_mnist.h"

#include <cctype>

#include "hyla/core/error.h"
#include "hyla/io/gzip.h"

namespace hyla {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension

uint32_t big_endian_u32(const std::string& bytes, size_t at) {
  return uint32_t(uint8_t(bytes[at])) << 24 | uint32_t(uint8_t(bytes[at + 1])) << 16 |
         uint32_t(uint8_t(bytes[at + 2])) << 8 | uint32_t(uint8_t(bytes[at + 3]));
}

// Checks the idx header (magic, dimensions) and that the data that follows has exactly the size
// the dimensions give; returns the dimensions.
std::vector<uint32_t> read_idx_header(const std::string& bytes, uint32_t magic, size_t dims, const std::string& name) {
  HYLA_CHECK(bytes.size() >= 4, "{}: truncated idx file ({} bytes, shorter than its magic number)", name, bytes.size());
  const uint32_t found = big_endian_u32(bytes, 0);
  HYLA_CHECK(found == magic, "{}: wrong idx magic number 0x{:08x} (expected 0x{:08x})", name, found, magic);
  HYLA_CHECK(bytes.size() >= 4 + 4 * dims, "{}: truncated idx file ({} bytes, shorter than its header)", name,
             bytes.size());
  std::vector<uint32_t> shape(dims);
  uint64_t elements = 1;
  for (size_t d = 0; d < dims; ++d) {
    shape[d] = big_endian_u32(bytes, 4 + 4 * d);
    HYLA_CHECK(shape[d] > 0 && shape[d] <= (1u << 24), "{}: idx dimension {} is {}", name, d, shape[d]);
    elements *= shape[d];
  }
  const uint64_t data = bytes.size() - 4 - 4 * dims;
  HYLA_CHECK(data >= elements, "{}: truncated idx file: the header promises {} bytes of data, the file holds {}", name,
             elements, data);
  HYLA_CHECK(data == elements, "{}: malformed idx file: {} bytes beyond the {} the header declares", name,
             data - elements, elements);
  return shape;
}

}  // namespace

IdxImages read_idx_images(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::string bytes = read_gzip_file(path);
  const std::vector<uint32_t> shape = read_idx_header(bytes, kImagesMagic, 3, name);
  IdxImages images;
  images.count = shape[0];
  images.rows = shape[1];
  images.cols = shape[2];
  images.pixels.assign(bytes.begin() + 16, bytes.end());
  return images;
}

std::vector<uint8_t> read_idx_labels(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::string bytes = read_gzip_file(path);
  read_idx_header(bytes, kLabelsMagic, 1, name);
  return std::vector<uint8_t>(bytes.begin() + 8, bytes.end());
}

LabeledImages load_fashion_mnist(const std::filesystem::path& dir, const std::string& split) {
  HYLA_CHECK(split == "train" || split == "test", "fashion-mnist split must be train or test, got '{}'", split);
  const std::string prefix = split == "train" ? "train" : "t10k";
  const auto images_path = dir / (prefix + "-images-idx3-ubyte.gz");
  const auto labels_path = dir / (prefix + "-labels-idx1-ubyte.gz");
  LabeledImages data{read_idx_images(images_path), read_idx_labels(labels_path)};
  HYLA_CHECK(uint64_t(data.images.count) == data.labels.size(), "{}: {} labels for the {} images of {}",
             labels_path.string(), data.labels.size(), data.images.count, images_path.string());
  for (size_t i = 0; i < data.labels.size(); ++i)
    HYLA_CHECK(data.labels[i] < kFashionMnistClasses.size(), "{}: label {} of image {} is not a class (0-9)",
               labels_path.string(), data.labels[i], i);
  return data;
}

std::string fashion_mnist_caption(int label) {
  HYLA_ASSERT(label >= 0 && label < int(kFashionMnistClasses.size()));
  std::string name(kFashionMnistClasses[size_t(label)]);
  for (char& c : name) c = char(std::tolower(uint8_t(c)));
  const bool vowel = std::string_view("aeiou").find(name[0]) != std::string_view::npos;
  return std::string("a photo of ") + (vowel ? "an " : "a ") + name;
}

}  // namespace hyla
