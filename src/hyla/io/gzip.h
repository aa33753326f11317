#pragma once
// Reading gzip-compressed files (zlib) with errors that name the file.
#include <filesystem>
#include <string>

namespace hyla {

// The decompressed contents of a gzip file; a file that is not gzip, is corrupt or ends early is
// a hyla::Error naming it.
std::string read_gzip_file(const std::filesystem::path& path);

}  // namespace hyla
