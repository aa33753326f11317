#pragma once
// The decoder (SPEC §2): embedding (and image patches, §7), layers of mixer + FFN joined by
// block attention residuals (§6) or the pre-norm residual, final norm and LM head.
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "hyla/model/attn_res.h"
#include "hyla/model/config.h"
#include "hyla/model/context.h"
#include "hyla/model/ffn.h"
#include "hyla/model/kda_mixer.h"
#include "hyla/model/layers.h"
#include "hyla/model/mla_mixer.h"
#include "hyla/model/params.h"

namespace hyla {

// An image as SPEC §7 reads it: H×W×C uint8, channel-last.
struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// One forward's input: token ids over a packed batch of sequences, optional targets for the
// loss (-1: no loss at that row, e.g. image positions and padding), and the images whose
// patches replace the <|image_pad|> rows, in order of appearance.
struct ModelInput {
  TokenBatch tokens;
  std::vector<int32_t> ids;      // [rows]
  std::vector<int32_t> targets;  // [rows] or empty
  std::vector<Image> images;
  int32_t image_pad_id = -1;     // the tokenizer's <|image_pad|> id (needed with images)
};

struct LossResult {
  double loss = 0;      // mean cross-entropy over rows with a target
  double aux_loss = 0;  // MoE auxiliary losses (aux_loss balancing), already in the gradient
  int64_t targets = 0;  // rows that had a target
};

// Wall time of the last forward (and backward) by part of the model, in seconds.
struct ModelTimings {
  double kda = 0, attention = 0, ffn = 0, total = 0;  // attention: latent attention mixers; ffn: dense and MoE
  double rest() const { return total - kda - attention - ffn; }
};

struct DecoderLayer {
  RmsNorm input_norm, post_attention_norm;
  std::variant<std::unique_ptr<KdaMixer>, std::unique_ptr<MlaMixer>> mixer;
  std::variant<std::unique_ptr<DenseFfn>, std::unique_ptr<MoeFfn>> ffn;
  AttnRes mixer_res, ffn_res;
};

// One sequence's inference state for every layer (memory owned by the caller): KDA layers' conv
// tails and delta-rule states, latent attention layers' latent caches.
struct SequenceCache {
  std::vector<KdaMixer::CacheView> kda;      // one per KDA layer, in layer order
  std::vector<MlaMixer::CacheView> latent;   // one per latent attention layer, in layer order
  int64_t tokens = 0;                        // tokens processed (positions continue from here)
};

class Model {
 public:
  // Registers every parameter; with `allocate` false only names and shapes exist (enough to
  // check a file or count a configuration too large to hold in memory).
  explicit Model(const ModelConfig& config, bool allocate = true);
  const ModelConfig& config() const { return config_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  void initialize(uint64_t seed);
  // Writes config.json, model.safetensors (weights in `dtype`) and, when given, a copy of the
  // tokenizer as tokenizer.json into a new directory that atomically replaces `dir`.
  void save(const std::filesystem::path& dir, DType dtype = DType::F32, const std::filesystem::path& tokenizer = {}) const;
  // Loads config.json and the weights of a model directory: F32, BF16 or F16, or a directory
  // written by `hyla quantize` (int8 weights, docs/quantization.md), which serves inference
  // (logits, evaluate, forward_cached) but not training.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir);

  // Training: forward, cross-entropy over the targets (chunked over rows, never [rows, V] at
  // once), and backward, adding every parameter's gradient scaled by `loss_scale`.
  LossResult forward_backward(const ModelInput& in, Precision precision, float loss_scale = 1.0f);
  // Evaluation: the cross-entropy without gradients.
  LossResult evaluate(const ModelInput& in, Precision precision);
  // Logits [rows, V] of every row.
  Tensor logits(const ModelInput& in, Precision precision);
  // Inference: the new tokens of each sequence (in.tokens, positions continuing the caches), one
  // cache per sequence, updated in place; logits [sequences, V] of each sequence's last new token.
  Tensor forward_cached(const ModelInput& in, std::span<SequenceCache> caches, Precision precision);

  const ModelTimings& timings() const { return timings_; }
  // The mixers, in layer order, for sizing inference caches.
  std::vector<const KdaMixer*> kda_mixers() const;
  std::vector<const MlaMixer*> latent_mixers() const;

  // MoE: balancing after an optimiser step, and per-layer load statistics.
  void update_balancing();
  void discard_routing();  // a skipped step: forget its routing, keep the bias
  std::vector<MoeFfn::LoadStats> load_stats() const;

 private:
  enum class Mode { Train, Eval, Cached };
  void embed(const ModelInput& in);
  // Runs the layers from stream 0 (the embedding); returns the final hidden rows (pre-norm).
  const float* body_forward(const ForwardContext& ctx, Mode mode, std::span<SequenceCache> caches);
  void body_backward(const float* d_final);
  // Cross-entropy over rows with targets, chunked; with a gradient, writes d(normed) rows.
  LossResult head_loss(const float* normed, const std::vector<int32_t>& targets, Precision p, float* d_normed,
                       float loss_scale);
  void grow(int64_t rows);

  ModelConfig config_;
  ParamStore params_;
  Param* embed_ = nullptr;
  Linear lm_head_;  // over embed_ when tied
  RmsNorm final_norm_;
  std::vector<DecoderLayer> layers_;
  AttnRes out_res_;
  Linear patch_proj_;
  Param *patch_bias_ = nullptr, *row_embed_ = nullptr, *col_embed_ = nullptr;

  // Activations of the last forward, grown to the largest batch and reused. The residual stream
  // holds x0 and, per layer, the stream (or AttnRes partial) after the mixer and after the FFN.
  int64_t rows_ = 0, capacity_ = 0;
  const ModelInput* input_ = nullptr;
  Precision precision_ = Precision::F32;
  std::vector<Tensor> stream_, stream_grad_;
  std::vector<Tensor> sublayer_in_;  // h (AttnRes output) per sublayer; unused without AttnRes
  std::vector<Tensor> sublayer_u_;   // RMSNorm(h) per sublayer: the mixer's / FFN's input
  Tensor sublayer_out_, d_u_, d_h_, final_h_, final_normed_, d_final_, logits_chunk_;
  std::vector<int64_t> patch_rows_;  // rows that hold image patches (for the vision gradients)
  std::vector<std::pair<int64_t, int64_t>> patch_grid_;  // (grid row, grid column) of each patch
  Tensor patches_;                   // [patch rows, P·P·C] normalised pixels
  // The residual structure of the last forward: per sublayer (and the final AttnRes) the stream
  // entries its AttnRes mixed, and the entry its output was added to (-1: none).
  std::vector<std::vector<int>> ar_sources_;
  std::vector<int> base_;
  ModelTimings timings_;
};

}  // namespace hyla
