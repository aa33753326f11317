#pragma once
// Floating-point operations per token (one multiply-add = 2 FLOPs) for prefill and decode at a
// context length: the weight matmuls plus the mixers' terms that grow with context (formulas in
// docs/plan.md).
#include <cstdint>

#include "hyla/model/config.h"
#include "hyla/model/param_count.h"

namespace hyla {

struct TokenFlops {
  double weights = 0;      // 2 × matmul_parameters
  double mla_prefill = 0;  // scores + values over the causal prefix, averaged over the prompt
  double mla_decode = 0;   // absorbed form over the latent cache
  double kda_prefill = 0;  // chunked delta rule
  double kda_decode = 0;   // recurrence

  double prefill_attention() const { return mla_prefill + kda_prefill; }
  double decode_attention() const { return mla_decode + kda_decode; }
  double prefill() const { return weights + prefill_attention(); }
  double decode() const { return weights + decode_attention(); }
};

// Active parameters a token multiplies: all active ones except the input embedding table, which
// is a row lookup (unless tied, when the LM head multiplies it).
int64_t matmul_parameters(const ModelConfig& config, const ParamCounts& counts);

TokenFlops token_flops(const ModelConfig& config, const ParamCounts& counts, int64_t context);

}  // namespace hyla
