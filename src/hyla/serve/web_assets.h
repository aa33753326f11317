#pragma once
// The chat page's files (web/ in the repository: HTML, CSS and small JavaScript files, no build
// step, nothing fetched from elsewhere), compiled into the binary by cmake/EmbedWeb.cmake so that
// `hyla serve` needs no files beside it.
#include <cstddef>
#include <span>

namespace hyla {

struct WebAsset {
  const char* name;  // its file name in web/
  const unsigned char* data;
  size_t size;
};

std::span<const WebAsset> web_assets();

}  // namespace hyla
