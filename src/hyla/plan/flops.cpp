#include "hyla/plan/flops.h"

#include <algorithm>

#include "hyla/plan/layer_mix.h"

namespace hyla {

int64_t matmul_parameters(const ModelConfig& c, const ParamCounts& counts) {
  const int64_t lookup = c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size;
  return counts.active_sum() - lookup;
}

namespace {

// Mean number of positions a prompt token attends to over a prompt of `context` tokens, when each
// token sees itself and at most `window - 1` earlier ones (window = context for full attention).
double mean_attended(int64_t context, int64_t window) {
  const double C = double(context), W = double(std::min(window, context));
  return (W * (W + 1) / 2 + (C - W) * W) / C;
}

}  // namespace

TokenFlops token_flops(const ModelConfig& c, const ParamCounts& counts, int64_t context) {
  const LayerMix mix = layer_mix(c);
  TokenFlops f;
  f.weights = 2.0 * double(matmul_parameters(c, counts));

  const MlaConfig& m = c.mla;
  const double H = double(m.num_heads), r = double(m.kv_lora_rank);
  const double Dn = double(m.qk_nope_head_dim), Dr = double(m.qk_rope_head_dim), Dv = double(m.v_head_dim);
  const int64_t window = m.sliding_window > 0 ? m.sliding_window : context;
  // Prefill expands keys and values per head once per token (kv_b_proj, counted in the weights),
  // then each (query, key) pair costs a (Dn+Dr) score and a Dv value product.
  const double prefill_pairs =
      double(mix.mla) * mean_attended(context, context) + double(mix.swa) * mean_attended(context, window);
  f.mla_prefill = 2 * H * (Dn + Dr + Dv) * prefill_pairs;
  // Decode reads only the latent cache, so kv_b_proj is absorbed into the query and output: each
  // cached position costs an (r + Dr) score and an r-wide value product per head.
  const double decode_positions =
      double(mix.mla) * double(context) + double(mix.swa) * double(std::min(context, window));
  f.mla_decode = 2 * H * (2 * r + Dr) * decode_positions;

  // Per head and token (K = V = head_dim): decode does three K×V products (S̃ᵀk, the rank-one
  // update, Sᵀq). The chunked form (chunk C) does the same three against the chunk-start state,
  // plus, within the chunk's lower triangle, k·kᵀ and q·kᵀ (C·K each), T·K (C·K), T·V and the
  // intra-chunk attention·values (C·V each), and the triangular solve for T (C²/3).
  const double KH = double(c.kda.num_heads), K = double(c.kda.head_dim), V = K;
  const double Ck = double(std::min(c.kda.chunk_size, context));
  const double layers = double(mix.kda);
  f.kda_decode = layers * KH * 6 * K * V;
  f.kda_prefill = layers * KH * (6 * K * V + Ck * (3 * K + 2 * V) + Ck * Ck / 3);
  return f;
}

}  // namespace hyla
