// libFuzzer target for the safetensors header parser: any input must either parse into a
// consistent header or throw hyla::Error, never crash, hang or trip a sanitizer.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "hyla/core/error.h"
#include "hyla/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_bytes;  // the first 8 input bytes choose the size of the data section
  std::memcpy(&data_bytes, data, 8);
  data_bytes %= (1ull << 40);
  const std::string_view header(reinterpret_cast<const char*>(data) + 8, size - 8);
  try {
    const hyla::SafetensorsHeader h = hyla::parse_safetensors_header(header, data_bytes, "fuzz");
    uint64_t end = 0;
    for (const auto& t : h.tensors) {
      if (t.begin != end) __builtin_trap();  // accepted headers must tile the data exactly
      end = t.end;
    }
    if (end != data_bytes) __builtin_trap();
  } catch (const hyla::Error&) {
  }
  return 0;
}
