#include "hyla/model/mla_mixer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hyla/kernels/activations.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/matmul.h"
#include "hyla/kernels/rope.h"

namespace hyla {

StateSpec MlaMixer::state_spec(const ModelConfig& config, LayerType type) {
  const MlaConfig& m = config.mla;
  return {.values_per_token = m.kv_lora_rank + m.qk_rope_head_dim,
          .window = type == LayerType::Swa ? m.sliding_window : 0};
}

MlaMixer::MlaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config, LayerType type)
    : config_(config), type_(type) {
  const MlaConfig& m = config.mla;
  const int64_t d = config.hidden_size, H = m.num_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const Component c = Component::Mla;
  if (m.q_lora_rank == 0) q_proj_ = Linear(store, prefix + "q_proj", d, H * qk, c);
  else q_a_proj_ = Linear(store, prefix + "q_a_proj", d, m.q_lora_rank, c);
  kv_a_proj_ = Linear(store, prefix + "kv_a_proj_with_mqa", d, m.kv_lora_rank + m.qk_rope_head_dim, c);
  gate_width_ = m.output_gate ? (m.output_gate_per_head ? H : H * m.v_head_dim) : 0;
  if (m.output_gate) g_proj_ = Linear(store, prefix + "g_proj", d, gate_width_, c);
  if (m.q_lora_rank > 0) {
    q_a_norm_ = RmsNorm(store, prefix + "q_a_layernorm", m.q_lora_rank, c, float(m.norm_eps));
    q_b_proj_ = Linear(store, prefix + "q_b_proj", m.q_lora_rank, H * qk, c);
  }
  kv_a_norm_ = RmsNorm(store, prefix + "kv_a_layernorm", m.kv_lora_rank, c, float(m.norm_eps));
  // Float only: the absorbed decode reads its f32 values (decode_attention).
  kv_b_proj_ = Linear(store, prefix + "kv_b_proj", m.kv_lora_rank, H * (m.qk_nope_head_dim + m.v_head_dim), c,
                      Init::Normal, WeightStorage::FloatOnly);
  o_proj_ = Linear(store, prefix + "o_proj", H * m.v_head_dim, d, c, Init::NormalOutput);

  const Linear* q_input = m.q_lora_rank ? &q_a_proj_ : &q_proj_;
  input_proj_ = m.output_gate ? Linear::fuse({q_input, &kv_a_proj_, &g_proj_}) : Linear::fuse({q_input, &kv_a_proj_});
  heads_ = H;
  nope_dim_ = m.qk_nope_head_dim;
  rope_dim_ = m.qk_rope_head_dim;
  v_dim_ = m.v_head_dim;
  kv_lora_rank_ = m.kv_lora_rank;
  q_lora_rank_ = m.q_lora_rank;
  qk_dim_ = qk;
  rotate_ = rope_dim_ > 0 && m.rope;
  kv_offset_ = q_input->out();
  gate_offset_ = kv_offset_ + kv_lora_rank_ + rope_dim_;
  proj_width_ = input_proj_.out();
  window_ = state_spec(config, type).window;
  scale_ = float(1.0 / std::sqrt(double(qk)));
}

// ---------------------------------------------------------------------------------------------
// Steps shared by the training and the cached forward

float* MlaMixer::project_input(const float* u, int64_t rows, Precision p, const int64_t* positions,
                               LayerActivations& a) {
  float* proj = proj_ = a.take<float>(rows * proj_width_);
  input_proj_.forward(u, rows, proj, p);
  if (g_proj_.defined()) sigmoid_rows(proj + gate_offset_, rows, gate_width_, proj_width_);
  if (rotate_) rope_table(positions, rows, rope_dim_, config_.mla.rope_theta, rope_ = a.take<float>(rows * rope_dim_));
  return proj;
}

// q in the attention layout [rows, H, Dn + Dr], q_pe rotated (when rotate_).
float* MlaMixer::queries(const float* proj, int64_t rows, Precision p, bool save, LayerActivations& a) {
  const int64_t ldq = heads_ * qk_dim_;
  float* q = q_ = a.take<float>(rows * ldq);
  const float* unrotated = q;
  HeadLayout unrotated_layout{ldq, qk_dim_};
  if (q_lora_rank_ == 0) {  // q is the first block of proj's columns; copy it out (q_pe too when not rotated)
    const int64_t copied = rotate_ ? nope_dim_ : qk_dim_;
    copy_heads(proj, {proj_width_, qk_dim_}, rows, heads_, copied, q, {ldq, qk_dim_});
    unrotated = proj;
    unrotated_layout = {proj_width_, qk_dim_};
  } else {
    float* q_a = q_a_ = a.take<float>(rows * q_lora_rank_);
    q_a_norm_.forward(proj, rows, q_a, save, proj_width_, q_lora_rank_);
    q_b_proj_.forward(q_a, rows, q, p);
  }
  if (rotate_)
    rope_forward(rope_, rows, heads_, rope_dim_, unrotated + nope_dim_, unrotated_layout, q + nope_dim_,
                 {ldq, qk_dim_});
  return q;
}

// c = RMSNorm(W_kva u)'s latent part, [rows, kv_lora_rank].
float* MlaMixer::latents(const float* proj, int64_t rows, bool save, LayerActivations& a) {
  float* c = c_ = a.take<float>(rows * kv_lora_rank_);
  kv_a_norm_.forward(proj + kv_offset_, rows, c, save, proj_width_, kv_lora_rank_);
  return c;
}

// The shared k_pe, rotated (when rotate_), [rows, Dr]; nullptr when Dr = 0.
float* MlaMixer::rotated_key_pe(const float* proj, int64_t rows, LayerActivations& a) {
  if (!rope_dim_) return nullptr;
  float* k_pe = a.take<float>(rows * rope_dim_);
  const float* unrotated = proj + kv_offset_ + kv_lora_rank_;
  if (rotate_) rope_forward(rope_, rows, 1, rope_dim_, unrotated, {proj_width_, 0}, k_pe, {rope_dim_, 0});
  else copy_heads(unrotated, {proj_width_, 0}, rows, 1, rope_dim_, k_pe, {rope_dim_, 0});
  return k_pe;
}

// k [rows, H, Dn + Dr] = per head [k_nope | shared k_pe] and v [rows, H, Dv] from W_kvb c.
void MlaMixer::up_project(const float* latent, int64_t ld_latent, const float* k_pe, int64_t ld_pe, int64_t rows,
                          Precision p, float* k, float* v) {
  const int64_t per_head = nope_dim_ + v_dim_, ldk = heads_ * qk_dim_, ldv = heads_ * v_dim_;
  Frame scratch(workspace_->serial());
  float* kv = scratch.take<float>(rows * heads_ * per_head);
  kv_b_proj_.forward(latent, rows, kv, p, 0.0f, ld_latent);
  const HeadLayout kv_layout{heads_ * per_head, per_head};
  copy_heads(kv, kv_layout, rows, heads_, nope_dim_, k, {ldk, qk_dim_});
  if (rope_dim_) copy_heads(k_pe, {ld_pe, 0}, rows, heads_, rope_dim_, k + nope_dim_, {ldk, qk_dim_});
  copy_heads(kv + nope_dim_, kv_layout, rows, heads_, v_dim_, v, {ldv, v_dim_});
}

// y = W_o (o ⊙ σ(g)) (or W_o o without the gate).
void MlaMixer::output(const float* proj, const float* o, int64_t rows, Precision p, float* y, LayerActivations& a) {
  const float* attended = o;
  if (g_proj_.defined()) {
    const int64_t width = heads_ * v_dim_;
    float* gated = gated_ = a.take<float>(rows * width);
    sigmoid_gate_forward(o, proj + gate_offset_, proj_width_, rows, width, width / gate_width_, gated);
    attended = gated;
  }
  o_proj_.forward(attended, rows, y, p);
}

// ---------------------------------------------------------------------------------------------
// Training

void MlaMixer::forward(const float* u, float* y, const ForwardContext& ctx, std::span<LayerCache* const> caches,
                       DecodePath decode_path) {
  if (caches.empty()) return forward_full(u, y, ctx);
  latent_slots_.clear();
  for (LayerCache* slot : caches) latent_slots_.push_back(&std::get<LatentCache>(*slot));
  forward_cached(u, y, ctx, latent_slots_, decode_path);
}

void MlaMixer::forward_full(const float* u, float* y, const ForwardContext& ctx) {
  const TokenBatch& tokens = ctx.tokens;
  const int64_t N = tokens.rows;
  const Precision p = ctx.precision;
  const bool save = ctx.save_for_backward;
  HYLA_CHECK(int64_t(tokens.positions.size()) == N, "MLA forward: {} positions for {} rows", tokens.positions.size(), N);
  workspace_ = &ctx.workspace;
  LayerActivations a(kept_, ctx.workspace, save);
  const float* proj = project_input(u, N, p, tokens.positions.data(), a);
  const float* q = queries(proj, N, p, save, a);
  const float* c = latents(proj, N, save, a);
  const float* k_pe = rotated_key_pe(proj, N, a);
  float* k = k_ = a.take<float>(N * heads_ * qk_dim_);
  float* v = v_ = a.take<float>(N * heads_ * v_dim_);
  up_project(c, kv_lora_rank_, k_pe, rope_dim_, N, p, k, v);
  float* o = o_ = a.take<float>(N * heads_ * v_dim_);
  float* lse = lse_ = a.take<float>(N * heads_);
  const AttentionDims dims{heads_, qk_dim_, v_dim_, window_, scale_,
                           attention_use_bf16_products(p == Precision::BF16 && !save)};
  attention_forward(dims, tokens.batch(), tokens.starts.data(), tokens.starts.data(), q, k, v, o, lse, ctx.workspace);
  output(proj, o, N, p, y, a);
  saved_rows_ = save ? N : -1;
  if (!save) return;
  saved_u_ = u;
  saved_precision_ = p;
  saved_starts_.assign(tokens.starts.begin(), tokens.starts.end());
}

void MlaMixer::backward(const float* dy, float* du) {
  HYLA_CHECK(saved_rows_ >= 0, "MLA backward: no saved forward (run forward with save_for_backward first)");
  const int64_t N = saved_rows_, batch = int64_t(saved_starts_.size()) - 1;
  const Precision p = saved_precision_;
  const int64_t ldq = heads_ * qk_dim_, ldo = heads_ * v_dim_, per_head = nope_dim_ + v_dim_;
  const float* proj = proj_;
  const float* o = o_;
  Frame scratch(workspace_->serial());

  // y = W_o (o ⊙ σ(g))
  float* d_o = scratch.take<float>(N * ldo);
  o_proj_.backward_input(dy, N, d_o, p);
  o_proj_.backward_weight(g_proj_.defined() ? gated_ : o, dy, N, p);
  float* dproj = scratch.take<float>(N * proj_width_);
  if (g_proj_.defined())
    sigmoid_gate_backward(o, proj + gate_offset_, proj_width_, N, ldo, ldo / gate_width_, d_o, dproj + gate_offset_,
                          proj_width_);

  // Attention
  float* dq = scratch.take<float>(N * ldq);
  float* dk = scratch.take<float>(N * ldq);
  float* dv = scratch.take<float>(N * ldo);
  const AttentionDims dims{heads_, qk_dim_, v_dim_, window_, scale_};
  attention_backward(dims, batch, saved_starts_.data(), saved_starts_.data(), q_, k_, v_, o, lse_, d_o, dq, dk, dv,
                     *workspace_);

  // Keys and values: per head back into W_kvb's row layout; the shared k_pe's gradient is the sum
  // over heads, rotated back (when rotated), in proj's k_pe columns.
  float* dkv = scratch.take<float>(N * heads_ * per_head);
  float* dk_pe = dproj + kv_offset_ + kv_lora_rank_;
  const HeadLayout kv_layout{heads_ * per_head, per_head};
  copy_heads(dk, {ldq, qk_dim_}, N, heads_, nope_dim_, dkv, kv_layout);
  copy_heads(dv, {ldo, v_dim_}, N, heads_, v_dim_, dkv + nope_dim_, kv_layout);
  sum_heads(dk + nope_dim_, {ldq, qk_dim_}, N, heads_, rope_dim_, dk_pe, proj_width_);
  if (rotate_) rope_backward(rope_, N, 1, rope_dim_, dk_pe, {proj_width_, 0}, dk_pe, {proj_width_, 0});
  kv_b_proj_.backward_weight(c_, dkv, N, p);
  float* dc = scratch.take<float>(N * kv_lora_rank_);
  kv_b_proj_.backward_input(dkv, N, dc, p);
  kv_a_norm_.backward(dc, dproj + kv_offset_, false, *workspace_, kv_lora_rank_, proj_width_);

  // Queries
  if (q_lora_rank_ == 0) {
    const int64_t copied = rotate_ ? nope_dim_ : qk_dim_;
    copy_heads(dq, {ldq, qk_dim_}, N, heads_, copied, dproj, {proj_width_, qk_dim_});
    if (rotate_)
      rope_backward(rope_, N, heads_, rope_dim_, dq + nope_dim_, {ldq, qk_dim_}, dproj + nope_dim_,
                    {proj_width_, qk_dim_});
  } else {
    if (rotate_)
      rope_backward(rope_, N, heads_, rope_dim_, dq + nope_dim_, {ldq, qk_dim_}, dq + nope_dim_,
                    {ldq, qk_dim_});
    q_b_proj_.backward_weight(q_a_, dq, N, p);
    float* dq_a = scratch.take<float>(N * q_lora_rank_);
    q_b_proj_.backward_input(dq, N, dq_a, p);
    q_a_norm_.backward(dq_a, dproj, false, *workspace_, q_lora_rank_, proj_width_);
  }

  input_proj_.backward_weight(saved_u_, dproj, N, p);
  input_proj_.backward_input(dproj, N, du, p);
}

// ---------------------------------------------------------------------------------------------
// Inference on a latent cache

void MlaMixer::forward_cached(const float* u, float* y, const ForwardContext& ctx, std::span<LatentCache* const> caches,
                              DecodePath decode_path) {
  const TokenBatch& tokens = ctx.tokens;
  const int64_t N = tokens.rows, batch = tokens.batch();
  HYLA_CHECK(int64_t(caches.size()) == batch, "MLA forward on caches: {} caches for {} sequences", caches.size(), batch);
  HYLA_CHECK(int64_t(tokens.positions.size()) == N, "MLA forward on caches: {} positions for {} rows",
             tokens.positions.size(), N);
  for (int64_t b = 0; b < batch; ++b) {
    const LatentCache& c = *caches[size_t(b)];
    HYLA_CHECK((c.latent_bf16 != nullptr) != (c.latent_f32 != nullptr),
               "MLA forward on caches: cache {} needs exactly one of latent_bf16 and latent_f32", b);
    HYLA_CHECK((c.latent_bf16 != nullptr) == (caches[0]->latent_bf16 != nullptr),
               "MLA forward on caches: cache {} has another dtype than cache 0", b);
    const int64_t n = tokens.length(b);
    HYLA_CHECK(c.length >= 0 && c.length + n <= c.capacity,
               "MLA forward on caches: cache {} holds {} of {} tokens; {} more do not fit", b, c.length, c.capacity, n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t position = tokens.positions[size_t(tokens.starts[size_t(b)] + i)];
      HYLA_CHECK(position == c.length + i, "MLA forward on caches: token {} of sequence {} has position {}, expected {}",
                 i, b, position, c.length + i);
    }
  }
  saved_rows_ = -1;  // the buffer pointers below are the ones a saved forward left for backward
  const Precision p = ctx.precision;
  workspace_ = &ctx.workspace;
  LayerActivations a(kept_, ctx.workspace, /*keep=*/false);
  const float* proj = project_input(u, N, p, tokens.positions.data(), a);
  const float* q = queries(proj, N, p, false, a);
  const float* c = latents(proj, N, false, a);
  const float* k_pe = rotated_key_pe(proj, N, a);
  append_to_caches(tokens, c, k_pe, caches);

  prefill_.clear();
  decode_.clear();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = tokens.length(b);
    if (n == 1 && decode_path == DecodePath::Absorbed) decode_.push_back(b);
    else if (n > 0) prefill_.push_back(b);
  }
  float* o = a.take<float>(N * heads_ * v_dim_);
  if (!prefill_.empty()) prefill_attention(tokens, caches, prefill_, q, p, o);
  if (!decode_.empty()) decode_attention(tokens, caches, decode_, q, p, o);
  for (int64_t b = 0; b < batch; ++b) caches[size_t(b)]->length += tokens.length(b);
  output(proj, o, N, p, y, a);
}

// Rows [length, length + new) of each cache = [c | k_pe] of the sequence's new tokens.
void MlaMixer::append_to_caches(const TokenBatch& tokens, const float* c, const float* k_pe,
                                std::span<LatentCache* const> caches) {
  const int64_t width = cache_width();
  for (int64_t b = 0; b < tokens.batch(); ++b) {
    const LatentCache& cache = *caches[size_t(b)];
    const int64_t n = tokens.length(b), first = tokens.starts[size_t(b)];
    const auto append = [&](auto* rows) {
      copy_heads(c + first * kv_lora_rank_, {kv_lora_rank_, 0}, n, 1, kv_lora_rank_, rows, {width, 0});
      if (rope_dim_) copy_heads(k_pe + first * rope_dim_, {rope_dim_, 0}, n, 1, rope_dim_, rows + kv_lora_rank_, {width, 0});
    };
    if (cache.latent_bf16) append(cache.latent_bf16 + cache.length * width);
    else append(cache.latent_f32 + cache.length * width);
  }
}

// Chunks of several tokens: up-project each sequence's visible cached latents (its new tokens
// included, as the cache holds them) to per-head keys and values, then run the blocked attention
// kernel with q_len < kv_len. A query at position t sees rows max(0, t − window + 1) .. t, so a
// sliding-window layer up-projects only the rows its first new token can see.
void MlaMixer::prefill_attention(const TokenBatch& tokens, std::span<LatentCache* const> caches,
                                 const std::vector<int64_t>& sequences, const float* q, Precision p, float* o) {
  const int64_t width = cache_width(), ldq = heads_ * qk_dim_, ldo = heads_ * v_dim_;
  q_starts_.assign(1, 0);
  k_starts_.assign(1, 0);
  first_key_.clear();
  for (int64_t b : sequences) {
    const LatentCache& cache = *caches[size_t(b)];
    const int64_t n = tokens.length(b), first = window_ ? std::max<int64_t>(0, cache.length - window_ + 1) : 0;
    first_key_.push_back(first);
    q_starts_.push_back(q_starts_.back() + n);
    k_starts_.push_back(k_starts_.back() + cache.length + n - first);
  }
  const int64_t count = int64_t(sequences.size()), queries = q_starts_.back(), keys = k_starts_.back();
  Frame scratch(workspace_->serial());
  float* latent = scratch.take<float>(keys * width);
  for (int64_t s = 0; s < count; ++s) {
    const LatentCache& cache = *caches[size_t(sequences[size_t(s)])];
    const int64_t first = first_key_[size_t(s)], rows = k_starts_[size_t(s) + 1] - k_starts_[size_t(s)];
    float* into = latent + k_starts_[size_t(s)] * width;
    if (cache.latent_bf16) copy_heads(cache.latent_bf16 + first * width, {width, 0}, rows, 1, width, into, {width, 0});
    else copy_heads(cache.latent_f32 + first * width, {width, 0}, rows, 1, width, into, {width, 0});
  }
  float* k = scratch.take<float>(keys * ldq);
  float* v = scratch.take<float>(keys * ldo);
  up_project(latent, width, latent + kv_lora_rank_, width, keys, p, k, v);

  // The sequences' query rows, packed in their order (the kernel takes contiguous sequences).
  float* q_rows = scratch.take<float>(queries * ldq);
  float* o_rows = scratch.take<float>(queries * ldo);
  for (int64_t s = 0; s < count; ++s) {
    const int64_t from = tokens.starts[size_t(sequences[size_t(s)])];
    std::memcpy(q_rows + q_starts_[size_t(s)] * ldq, q + from * ldq,
                size_t((q_starts_[size_t(s) + 1] - q_starts_[size_t(s)]) * ldq) * sizeof(float));
  }
  const AttentionDims dims{heads_, qk_dim_, v_dim_, window_, scale_, attention_use_bf16_products(p == Precision::BF16)};
  attention_forward(dims, count, q_starts_.data(), k_starts_.data(), q_rows, k, v, o_rows,
                    scratch.take<float>(queries * heads_), *workspace_);
  for (int64_t s = 0; s < count; ++s) {
    const int64_t to = tokens.starts[size_t(sequences[size_t(s)])];
    std::memcpy(o + to * ldo, o_rows + q_starts_[size_t(s)] * ldo,
                size_t((q_starts_[size_t(s) + 1] - q_starts_[size_t(s)]) * ldo) * sizeof(float));
  }
}

// Single tokens, absorbed (SPEC §4): q̃_h = W_kb,hᵀ q_nope,h, attention over the latent cache rows
// [c | k_pe] with the query [q̃_h | q_pe,h], then o_h = W_vb,h o_latent,h. W_kb,h and W_vb,h are
// head h's key and value rows of kv_b_proj ([Dn, R] and [Dv, R]), so each product is one batched
// GEMM over heads whose rows are the decoding sequences. They use the f32 weights: the absorbed
// query multiplies every cached row, so it is kept exact. Under Precision::BF16 on a bf16 cache
// the attention itself runs on bf16 products (LatentAttentionDims::bf16_products) where the
// kernels find them fastest (latent_attention_use_bf16_products), else on f32 products over the
// widened rows.
void MlaMixer::decode_attention(const TokenBatch& tokens, std::span<LatentCache* const> caches,
                                const std::vector<int64_t>& sequences, const float* q, Precision p, float* o) {
  const int64_t count = int64_t(sequences.size()), R = kv_lora_rank_, width = cache_width();
  const int64_t ldq = heads_ * qk_dim_, ldo = heads_ * v_dim_, head_rows = (nope_dim_ + v_dim_) * R;
  Frame scratch(workspace_->serial());
  float* q_rows = scratch.take<float>(count * ldq);
  for (int64_t s = 0; s < count; ++s)
    std::memcpy(q_rows + s * ldq, q + tokens.starts[size_t(sequences[size_t(s)])] * ldq, size_t(ldq) * sizeof(float));

  float* q_absorbed = scratch.take<float>(count * heads_ * width);
  const float* w_kvb = kv_b_proj_.w();
  if (nope_dim_)
    gemm_batched(heads_, Trans::N, Trans::N, count, R, nope_dim_, 1.0f, q_rows, ldq, qk_dim_, w_kvb, R, head_rows,
                 0.0f, q_absorbed, heads_ * width, width);
  else
    for (int64_t r = 0; r < count * heads_; ++r) std::fill_n(q_absorbed + r * width, R, 0.0f);
  copy_heads(q_rows + nope_dim_, {ldq, qk_dim_}, count, heads_, rope_dim_, q_absorbed + R, {heads_ * width, width});

  decode_caches_.clear();
  for (int64_t b : sequences) {
    const LatentCache& cache = *caches[size_t(b)];
    decode_caches_.push_back({cache.latent_bf16, cache.latent_f32, cache.length + 1});
  }
  float* o_latent = scratch.take<float>(count * heads_ * R);
  const bool bf16_rows = caches[0]->latent_bf16 != nullptr;
  const LatentAttentionDims dims{heads_, R, rope_dim_, window_, scale_,
                                 latent_attention_use_bf16_products(R, bf16_rows, p == Precision::BF16)};
  latent_attention_decode(dims, count, decode_caches_.data(), q_absorbed, o_latent, *workspace_);

  float* o_rows = scratch.take<float>(count * ldo);
  gemm_batched(heads_, Trans::N, Trans::T, count, v_dim_, R, 1.0f, o_latent, heads_ * R, R, w_kvb + nope_dim_ * R, R,
               head_rows, 0.0f, o_rows, ldo, v_dim_);
  for (int64_t s = 0; s < count; ++s)
    std::memcpy(o + tokens.starts[size_t(sequences[size_t(s)])] * ldo, o_rows + s * ldo, size_t(ldo) * sizeof(float));
}

}  // namespace hyla
