#include "hyla/io/gzip.h"

#include <zlib.h>

#include "hyla/core/error.h"
#include "hyla/io/file.h"

namespace hyla {

std::string read_gzip_file(const std::filesystem::path& path) {
  const std::string compressed = read_file(path);
  const std::string name = path.string();
  HYLA_CHECK(compressed.size() >= 2 && uint8_t(compressed[0]) == 0x1f && uint8_t(compressed[1]) == 0x8b,
             "{}: not a gzip file (bad magic bytes)", name);
  z_stream stream{};
  HYLA_CHECK(inflateInit2(&stream, 16 + MAX_WBITS) == Z_OK, "{}: cannot initialise zlib", name);
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  stream.avail_in = uInt(compressed.size());
  std::string out;
  out.resize(compressed.size() * 4 + 1024);
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    if (stream.total_out == out.size()) out.resize(out.size() * 2);
    stream.next_out = reinterpret_cast<Bytef*>(out.data() + stream.total_out);
    stream.avail_out = uInt(std::min<size_t>(out.size() - stream.total_out, 1u << 30));
    status = inflate(&stream, Z_NO_FLUSH);
    if (status == Z_OK) continue;
    if (status != Z_STREAM_END) {
      // Z_BUF_ERROR with all input consumed: the stream stopped before its end marker.
      const bool truncated = status == Z_BUF_ERROR && stream.avail_in == 0;
      const std::string reason = truncated    ? "truncated (the stream ends early)"
                                 : stream.msg ? stream.msg
                                              : "zlib error " + std::to_string(status);
      inflateEnd(&stream);
      fail("{}: corrupt gzip data: {}", name, reason);
    }
  }
  out.resize(stream.total_out);
  inflateEnd(&stream);
  return out;
}

}  // namespace hyla
