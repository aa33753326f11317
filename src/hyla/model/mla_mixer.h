#pragma once
// Gated latent attention mixer (SPEC §4): full causal ("mla") or sliding-window ("swa").
//
// Training: forward over a packed batch (saving what backward needs) and backward. Inference: the
// same forward on a latent cache per sequence (a LatentCache slot), which holds per token only the
// normalised latent c and the rotated k_pe. A chunk of several new tokens (prefill) up-projects the cached latents to
// per-head keys and values and runs the blocked attention kernel; a single new token (decode) uses
// the absorbed form, which reads only the latent cache (kernels/latent_attention.h).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hyla/kernels/attention.h"
#include "hyla/kernels/latent_attention.h"
#include "hyla/model/layer_buffer.h"
#include "hyla/model/layer_cache.h"
#include "hyla/model/layers.h"
#include "hyla/model/state_spec.h"

namespace hyla {

class MlaMixer {
 public:
  MlaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config, LayerType type);

  // How a sequence with a single new token attends on its cache. Absorbed (the default) reads only
  // the latent cache; UpProjected treats it as a one-token prefill (up-project every visible cached
  // latent, then attend), the reference the absorbed form is measured and tested against.
  enum class DecodePath : uint8_t { Absorbed, UpProjected };
  // u [N, d] (the RMSNorm'd sublayer input; it must stay valid until backward when saving) → y [N, d].
  // Without caches (training, full sequences): causal within each packed sequence
  // (ctx.tokens.starts); "swa" layers see the last mla.sliding_window positions (the current one
  // included). RoPE (qk_rope_head_dim > 0 and mla.rope) uses ctx.tokens.positions. Under Precision::BF16 the
  // projections run on bf16 inputs; the attention products do too, except when saving for
  // backward: the backward recomputes probabilities in f32 from the saved log-sum-exp, which must
  // come from the same f32 products (see docs/kernels-attention.md).
  //
  // With one LatentCache slot per sequence (inference): sequence b's new tokens have positions
  // length + i; their rows [length, length + new) of the cache are written, length is bumped and y
  // is written for the new tokens. Every cache of a call has the same dtype. "swa" layers attend to
  // the last sliding_window positions only, although the cache keeps every token (the caller owns
  // its memory and may recycle rows older than the window). Under Precision::BF16 the projections,
  // the prefill attention and (on a bf16 cache) the decode attention use bf16 products. Invalidates
  // the state a training forward saved for backward.
  void forward(const float* u, float* y, const ForwardContext& ctx, std::span<LayerCache* const> caches = {},
               DecodePath decode_path = DecodePath::Absorbed);
  // From dy [N, d] of the last forward, which must have saved for backward (a later forward reuses
  // the buffers): du [N, d] overwritten, parameter gradients added.
  void backward(const float* dy, float* du);

  // A sequence's state (SPEC §4): per cached token kv_lora_rank values (the normalised latent c),
  // then qk_rope_head_dim (k_pe, already rotated, or as projected when mla.rope is false); "swa"
  // layers attend to the last mla.sliding_window tokens.
  static StateSpec state_spec(const ModelConfig& config, LayerType type);
  int64_t cache_width() const { return state_spec(config_, type_).values_per_token; }

 private:
  void forward_full(const float* u, float* y, const ForwardContext& ctx);
  void forward_cached(const float* u, float* y, const ForwardContext& ctx, std::span<LatentCache* const> caches,
                      DecodePath decode_path);
  // Steps shared by forward and forward_cached; each returns a buffer taken from `a`.
  float* project_input(const float* u, int64_t rows, Precision p, const int64_t* positions, LayerActivations& a);
  float* queries(const float* proj, int64_t rows, Precision p, bool save, LayerActivations& a);
  float* latents(const float* proj, int64_t rows, bool save, LayerActivations& a);
  float* rotated_key_pe(const float* proj, int64_t rows, LayerActivations& a);
  void up_project(const float* latent, int64_t ld_latent, const float* k_pe, int64_t ld_pe, int64_t rows,
                  Precision p, float* k, float* v);
  void output(const float* proj, const float* o, int64_t rows, Precision p, float* y, LayerActivations& a);
  // forward_cached's pieces: which rows of the batch each takes is in `sequences`.
  void append_to_caches(const TokenBatch& tokens, const float* c, const float* k_pe, std::span<LatentCache* const> caches);
  void prefill_attention(const TokenBatch& tokens, std::span<LatentCache* const> caches,
                         const std::vector<int64_t>& sequences, const float* q, Precision p, float* o);
  void decode_attention(const TokenBatch& tokens, std::span<LatentCache* const> caches,
                        const std::vector<int64_t>& sequences, const float* q, Precision p, float* o);

  const ModelConfig& config_;
  LayerType type_;
  // Registered in this order so that the projections of u, [q (or q_a) | kv_a | g], are one matrix.
  Linear q_proj_, q_a_proj_, kv_a_proj_, g_proj_, q_b_proj_, kv_b_proj_, o_proj_;
  RmsNorm q_a_norm_, kv_a_norm_;
  Linear input_proj_;  // the fused [q (or q_a) | kv_a | g]

  int64_t heads_, nope_dim_, rope_dim_, v_dim_, kv_lora_rank_, q_lora_rank_;
  int64_t qk_dim_;      // nope_dim_ + rope_dim_
  bool rotate_;         // rope_dim_ > 0 and mla.rope: q_pe and k_pe are rotated by position
  int64_t proj_width_;  // columns of input_proj_: [q or q_a | c | k_pe | g]
  int64_t kv_offset_, gate_offset_;
  int64_t gate_width_ = 0;  // σ values a row: H·Dv (per channel), H (per head), 0 (no gate)
  int64_t window_;
  float scale_;  // (Dn + Dr)^-1/2

  // What backward needs from the last saving forward (saved_rows_ < 0: nothing saved).
  const float* saved_u_ = nullptr;
  int64_t saved_rows_ = -1;
  Precision saved_precision_ = Precision::F32;
  std::vector<int64_t> saved_starts_;

  // The last forward's activations (N: the batch's rows), in kept_ when it saved for backward,
  // else in the workspace and gone after the call:
  float* proj_ = nullptr;   // N × proj_width_ (the gate columns hold σ(W_g u))
  float* rope_ = nullptr;   // N × Dr: cos | sin of each row's angles (rotate_ only)
  float* q_a_ = nullptr;    // N × q_lora_rank (normalised)
  float *q_ = nullptr, *k_ = nullptr;  // N × H·(Dn + Dr), attention layout
  float* v_ = nullptr;      // N × H·Dv
  float* c_ = nullptr;      // N × kv_lora_rank (normalised)
  float *o_ = nullptr, *gated_ = nullptr;  // N × H·Dv: attention output, and o ⊙ σ(g)
  float* lse_ = nullptr;    // N × H
  Arena kept_;
  Workspace* workspace_ = nullptr;  // the last forward's, for scratch (and the backward's)
  std::vector<int64_t> q_starts_, k_starts_, first_key_, prefill_, decode_;
  std::vector<LatentCacheRows> decode_caches_;
  std::vector<LatentCache*> latent_slots_;  // forward's slots, as this layer's kind
};

}  // namespace hyla
