#pragma once
// Decode attention on a latent KV cache (SPEC §4, absorbed form). Each sequence brings one query
// token; all H heads read the same cached rows [c | k_pe] (R latent values, then Dr rotated key
// values), so the cache is read once per step for every head, and no per-head key or value is
// ever formed:
//   score_h,s = scale · (q̃_h·c_s + q_pe,h·k_pe,s),   o_h = Σ_s softmax_s(score_h)·c_s  (R values)
// The caller absorbs W_kvb into q̃_h = W_kb,hᵀ q_nope,h before and applies o_h ← W_vb,h o_h after.
// Long caches are split into pieces computed in parallel and merged by their log-sum-exp.
// See docs/mla.md ("The latent decode kernel").
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hyla/core/half.h"
#include "hyla/core/workspace.h"

namespace hyla {

struct LatentAttentionDims {
  int64_t heads;   // H
  int64_t latent;  // R: latent values per cached row (kv_lora_rank)
  int64_t rope;    // Dr: rotated key values per cached row, after the latent ones (0 for NoPE)
  int64_t window;  // 0: the query sees every cached row; else only the last `window` rows
  float scale;     // (Dn + Dr)^-1/2
  // bf16 rows with latent a multiple of 32 only: the products take the cached rows as they are and
  // the query and probabilities rounded to bf16, two multiply-adds per lane and instruction
  // (vdpbf16ps; f32 accumulation, softmax, max and sums in f32). Half the arithmetic of the f32
  // path, with errors ~2^-9 of the output's scale.
  bool bf16_products = false;
};

// One sequence's cache: `length` rows of R + Dr values, bf16 or f32 (exactly one pointer set).
// The query is the token in the last row.
struct LatentCacheRows {
  const bf16* rows_bf16 = nullptr;
  const float* rows_f32 = nullptr;
  int64_t length = 0;
};

// q [batch, H, R + Dr]: per head the absorbed query q̃ (R values) then the rotated q_pe (Dr).
// Writes o [batch, H, R]. All caches of a call have the same dtype. A sequence whose cache is empty
// gets o = 0. Without bf16_products the arithmetic is f32 (bf16 rows are widened exactly), so the
// result is that of up-projecting the cache and running ordinary attention, to f32 rounding.
void latent_attention_decode(const LatentAttentionDims& dims, int64_t batch, const LatentCacheRows* caches,
                             const float* q, float* o, Workspace& workspace);

// Whether a decode whose caller allows bf16 rounding (`allowed`) is fastest with bf16_products:
// on bf16 rows (`bf16_rows`) with latent a multiple of 32, where they run on this machine's bf16
// dot-product instructions. The one place this choice is made.
bool latent_attention_use_bf16_products(int64_t latent, bool bf16_rows, bool allowed);

}  // namespace hyla
