// The tree's layering, read from the code: every `#include "hyla/<folder>/..."` in src/hyla runs
// down the stack below (or stays in its folder), so there are no folder cycles and no arrow back
// up; and only the kernels see their CPU implementation (kernels/cpu/), so a second backend
// replaces it behind the op headers. docs/architecture.md draws the same map; a new folder takes
// its place in both.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

namespace hyla {
namespace {

// Bottom to top: a folder may include its own headers and those of folders before it.
const std::vector<std::string> kLayers = {"core", "io",    "kernels", "model", "plan", "data", "dist",
                                          "infer", "agent", "eval",   "train", "rl",   "quant", "serve"};

int64_t layer_of(const std::string& folder) {
  const auto at = std::find(kLayers.begin(), kLayers.end(), folder);
  return at == kLayers.end() ? -1 : int64_t(at - kLayers.begin());
}

TEST(Architecture, EveryIncludeRunsDownTheLayers) {
  const std::filesystem::path root = test::source_dir() / "src" / "hyla";
  const std::regex include(R"(^\s*#\s*include\s+"hyla/([a-z_]+)/([a-z_]+/)?)");
  int64_t includes = 0;
  for (const auto& folder : std::filesystem::directory_iterator(root)) {
    const std::string name = folder.path().filename().string();
    ASSERT_GE(layer_of(name), 0) << "src/hyla/" << name << " has no place in kLayers (and in docs/architecture.md)";
    for (const auto& file : std::filesystem::recursive_directory_iterator(folder.path())) {
      if (!file.is_regular_file()) continue;
      std::ifstream in(file.path());
      std::string line;
      std::smatch m;
      while (std::getline(in, line))
        if (std::regex_search(line, m, include)) {
          ++includes;
          const std::string from = std::filesystem::relative(file.path(), root).string();
          EXPECT_LE(layer_of(m[1].str()), layer_of(name)) << from << " includes hyla/" << m[1].str()
                                                          << "/, a folder above " << name;
          EXPECT_FALSE(m[1].str() == "kernels" && m[2].str() == "cpu/" && name != "kernels")
              << from << " includes the CPU backend's own header; call an op of kernels/ instead";
        }
    }
  }
  EXPECT_GT(includes, 500);  // the walk read the tree
}

}  // namespace
}  // namespace hyla
