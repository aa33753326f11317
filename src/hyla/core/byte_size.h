#pragma once
// Sizes people type on command lines: "512M", "2GiB", "1000000".
#include <cstdint>
#include <optional>
#include <string_view>

namespace hyla {

// Bytes with an optional unit (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB; all binary); nullopt
// when the text is not one (the caller names its flag in the error).
std::optional<int64_t> parse_byte_size(std::string_view text);

// Bytes of physical memory on this machine.
int64_t physical_memory_bytes();

}  // namespace hyla
