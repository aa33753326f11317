// libFuzzer target for parse_json, the reader of every outside JSON document (request bodies,
// config.json, tokenizer.json, safetensors headers): any input must parse or throw hyla::Error, and
// what parses must survive what the server does with values (copy, compare, print in a message).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json value = hyla::parse_json(text, "fuzz");
    const nlohmann::json copy = value;
    if (!(copy == value) && !value.is_number_float()) __builtin_trap();  // NaN never parses; floats compare
    (void)hyla::json_excerpt(value);
  } catch (const hyla::Error&) {
  }
  return 0;
}
