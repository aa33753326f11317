#include "hyla/plan/formats.h"

#include <vector>

#include "hyla/core/error.h"

namespace hyla {

namespace {

NumberFormat parse(const std::string& text, const std::vector<NumberFormat>& formats, const char* option) {
  std::string names;
  for (const NumberFormat& f : formats) {
    if (f.name == text) return f;
    names += (names.empty() ? "" : ", ") + f.name;
  }
  fail("{}: unknown format '{}' (known: {})", option, text, names);
}

}  // namespace

NumberFormat parse_weight_format(const std::string& text, const std::string& option) {
  // Scale layouts as the common kernels store them: fp8 with one f32 scale per 128x128 block
  // (DeepSeek-V3 style), integers with one scale per group of 128 weights along the input.
  static const std::vector<NumberFormat> kFormats = {
      {"bf16", 2.0, "2 B"},
      {"fp8", 1.0 + 4.0 / (128 * 128), "1 B + f32 scale per 128x128 block"},
      {"int8", 1.0 + 4.0 / 128, "1 B + f32 scale per 128 weights"},
      {"int4", 0.5 + 2.0 / 128, "0.5 B + f16 scale per 128 weights"},
      // GGUF's: what Kimi K3's lossless file stores (MXFP4 experts, the rest Q8_0 or BF16).
      {"q8_0", 1.0 + 2.0 / 32, "1 B + f16 scale per 32 weights"},
      {"mxfp4", 0.5 + 1.0 / 32, "0.5 B + E8M0 scale per 32 weights"},
  };
  return parse(text, kFormats, option.c_str());
}

NumberFormat parse_cache_format(const std::string& text) {
  // The cache is written one token at a time, so fp8 uses a per-tensor scale: no per-value overhead.
  static const std::vector<NumberFormat> kFormats = {{"bf16", 2.0, "2 B"}, {"fp8", 1.0, "1 B"}};
  return parse(text, kFormats, "--kv");
}

}  // namespace hyla
