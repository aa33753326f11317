#pragma once
// Fashion-MNIST read straight from its idx*-ubyte.gz files (as the Debian package
// dataset-fashion-mnist installs them): 28x28 grey images and labels 0-9.
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace hyla {

inline constexpr std::string_view kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr std::array<std::string_view, 10> kFashionMnistClasses = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major
};

// idx3-ubyte image and idx1-ubyte label files, gzip-compressed; magic numbers, dimensions and sizes
// are checked, and errors name the file.
IdxImages read_idx_images(const std::filesystem::path& path);
std::vector<uint8_t> read_idx_labels(const std::filesystem::path& path);

struct LabeledImages {
  IdxImages images;
  std::vector<uint8_t> labels;  // one per image, < 10
};
// `split` is "train" (60000 images) or "test" (10000).
LabeledImages load_fashion_mnist(const std::filesystem::path& dir, const std::string& split);

// "a photo of a sneaker", "a photo of an ankle boot", ...
std::string fashion_mnist_caption(int label);

}  // namespace hyla
