#include "hyla/core/byte_size.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <utility>

namespace hyla {

std::optional<int64_t> parse_byte_size(std::string_view text) {
  const char* first = text.data();
  const char* last = first + text.size();
  double value = 0;
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec != std::errc() || end == first || !std::isfinite(value) || value < 0) return std::nullopt;
  static const std::pair<std::string_view, double> kUnits[] = {
      {"", 1},        {"B", 1},        {"K", 0x1p10},   {"KB", 0x1p10}, {"KiB", 0x1p10},
      {"M", 0x1p20},  {"MB", 0x1p20},  {"MiB", 0x1p20}, {"G", 0x1p30},  {"GB", 0x1p30},
      {"GiB", 0x1p30}, {"T", 0x1p40},  {"TB", 0x1p40},  {"TiB", 0x1p40}};
  const std::string_view unit(end, size_t(last - end));
  for (const auto& [name, scale] : kUnits)
    if (unit == name) {
      const double bytes = value * scale;
      if (bytes >= 0x1p62) return std::nullopt;
      return int64_t(bytes);
    }
  return std::nullopt;
}

int64_t physical_memory_bytes() { return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE)); }

}  // namespace hyla
