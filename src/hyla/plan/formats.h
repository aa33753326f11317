#pragma once
// Storage formats the planner prices: weights (with their block-scale overhead) and the latent cache.
#include <string>

namespace hyla {

struct NumberFormat {
  std::string name;
  double bytes_per_value = 0;  // including the amortised share of its scales
  std::string layout;          // how the bytes come about, for the report
};

// bf16 | fp8 | int8 | int4 | q8_0 | mxfp4; anything else is a one-line hyla::Error naming `option`.
NumberFormat parse_weight_format(const std::string& text, const std::string& option = "--weights");
// bf16 | fp8.
NumberFormat parse_cache_format(const std::string& text);

}  // namespace hyla
