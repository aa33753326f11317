#pragma once
// The decoder (SPEC §2): embedding (and image patches, §7), layers of mixer + FFN joined by
// block attention residuals (§6) or the pre-norm residual, final norm and LM head.
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/model/attn_res.h"
#include "hyla/model/config.h"
#include "hyla/model/context.h"
#include "hyla/model/expert_offload.h"
#include "hyla/model/ffn.h"
#include "hyla/model/layers.h"
#include "hyla/model/mixers.h"
#include "hyla/model/moonvit.h"
#include "hyla/model/params.h"

namespace hyla {

// One forward's input: token ids over a packed batch of sequences, optional targets for the
// loss (-1: no loss at that row, e.g. image positions and padding) with optional per-row weights
// (zero for prompts and tool outputs, advantages for policy gradients), and the images whose
// patches replace the <|image_pad|> rows, in order of appearance.
struct ModelInput {
  TokenBatch tokens;
  std::vector<int32_t> ids;          // [rows]
  std::vector<int32_t> targets;      // [rows] or empty: no loss
  std::vector<float> loss_weights;   // [rows] or empty: 1 for every row with a target
  // The loss reads the logits divided by this (> 0): rows a policy sampled at a temperature are
  // scored under the distribution that sampled them. 1: the model's own distribution.
  float temperature = 1.0f;
  std::vector<Image> images;
  int32_t image_pad_id = -1;         // the tokenizer's <|image_pad|> id (needed with images)
};

// Which rows of a forward come out as logits (llama.cpp's out_ids).
enum class Outputs : uint8_t {
  None,                // training and evaluation: only the loss
  LastOfEachSequence,  // generation: [sequences, V]
  All,                 // scoring every token: [rows, V]
  Rows,                // ForwardOptions::rows, in that order
};

struct ForwardOptions {
  Precision precision = Precision::F32;
  Outputs outputs = Outputs::LastOfEachSequence;
  std::vector<int64_t> rows;  // with Outputs::Rows
  // Training: save activations, then add every parameter's gradient of loss × loss_scale (needs
  // targets; gradient buffers exist only for forwards that ask for this).
  bool backward = false;
  float loss_scale = 1.0f;
};

struct LossResult {
  double loss = 0;      // Σ weight × cross-entropy over rows with a target, over the number of such rows
  double aux_loss = 0;  // MoE auxiliary losses (aux_loss balancing), already in the gradient
  int64_t targets = 0;  // rows that had a target
};

struct ForwardResult {
  Tensor logits;    // the rows options.outputs chose, [n, V]; undefined for Outputs::None
  LossResult loss;  // when the input has targets
};

// Wall time of the last forward (and backward) by part of the model, in seconds.
struct ModelTimings {
  double kda = 0, attention = 0, ffn = 0, total = 0;  // attention: latent attention mixers; ffn: dense and MoE
  double vision = 0;                                  // the MoonViT tower (part of rest())
  double rest() const { return total - kda - attention - ffn; }
};

struct ModelLoadOptions {
  // ParamStore::hold_only: this process loads only these parameters (expert parallelism).
  std::function<bool(const Param&)> holds;
  // The routed experts stay in the files, served through a resident cache (expert_offload.h).
  std::optional<ExpertOffloadOptions> offload_experts;
  // Float matrices held as bf16 alone (Param::bf16_only): for an engine at Precision::BF16, whose
  // products read nothing else; a third of the memory of f32 values plus the bf16 copy.
  bool bf16_matrices = false;
  // A GGUF's quantised matrices decoded to f32 (GgufQuantized::Decoded) instead of multiplied as
  // they are stored (whose products round the activations to 8 bits): the f32 evaluation of the
  // file's weights, SPEC's logits contract.
  bool decode_quantized = false;
  // A llama.cpp mmproj file whose vision tower joins a text-only model (model/moonvit_gguf.h).
  std::filesystem::path mmproj;
};

struct DecoderLayer {
  RmsNorm input_norm, post_attention_norm;
  Mixer mixer;
  std::variant<std::unique_ptr<DenseFfn>, std::unique_ptr<MoeFfn>> ffn;
  AttnRes mixer_res, ffn_res;
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
  // written by `hyla quantize` (int8 weights, docs/quantization.md), which serves inference but
  // not training; or a llama.cpp GGUF file (model/gguf_model.h).
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, const ModelLoadOptions& options = {});
  // The routed experts' cache when loaded with offload_experts, else null.
  ExpertOffload* expert_offload() const { return offload_.get(); }

  // The one forward. Without caches every sequence starts empty (training, evaluation, scoring);
  // with one cache per sequence, the new tokens (positions continuing the caches) extend them in
  // place (prefill chunks and decoding). With targets, the cross-entropy (chunked over rows, never
  // [rows, V] at once); options.backward adds the gradients. Logits of the rows options.outputs
  // chooses, whatever the path: every token of a chunked, cached prefill can be scored.
  ForwardResult forward(const ModelInput& in, const ForwardOptions& options, std::span<SequenceCache> caches = {});

  const ModelTimings& timings() const { return timings_; }
  // MoonViT's output for the last forward's images, [image rows, d] in the order of their rows
  // (the embeddings that replaced them); [0, d] when it had none. Tower "moonvit" only.
  Tensor image_embeddings() const;
  // During each backward, `hook(offset)` once every gradient at flat offsets >= offset
  // (ParamStore::grads) is final: after the head, after each decoder layer from the last, and 0 at
  // the end. Data parallelism reduces those while the backward goes on (train/gradient_reducer.h).
  // An empty hook removes it.
  void set_gradient_hook(std::function<void(int64_t offset)> hook);

  // MoE: balancing after an optimiser step (every process's routing, through `collective`), and
  // per-layer load statistics.
  void update_balancing(Collective& collective = single_process());
  // Where every MoE layer's routed experts run (expert_exchange.h; default: all here): one
  // exchange for all, or one per MoE layer (in depth order) that the model keeps.
  void set_expert_exchange(ExpertExchange& exchange);
  void own_expert_exchanges(std::vector<std::unique_ptr<ExpertExchange>> exchanges);
  // The MoE sublayers in depth order.
  std::vector<MoeFfn*> moe_layers() const;
  void discard_routing();  // a skipped step: forget its routing, keep the bias
  std::vector<MoeFfn::LoadStats> load_stats() const;

 private:
  // How the residual stream joins the sublayers, fixed by the config (SPEC §6): stream entry 0 is
  // the embedding and sublayer s writes entry s + 1 (its output added to entry `base`, -1: none).
  // Its input is entry `input`, or with AttnRes the mix of the entries in `sources`.
  struct Sublayer {
    int input = -1, base = -1;
    std::vector<int> sources;
  };
  void check_input(const ModelInput& in, const ForwardOptions& options, std::span<SequenceCache> caches) const;
  void embed(const ModelInput& in, Precision precision, bool save);
  void embed_moonvit(const ModelInput& in, Precision precision, bool save);
  // Runs the layers from stream 0 (the embedding); returns the final hidden rows (pre-norm).
  const float* body_forward(const ForwardContext& ctx, std::span<SequenceCache> caches);
  void body_backward(const float* d_final);
  // Cross-entropy over rows with targets, chunked; with a gradient, writes d(normed) rows.
  LossResult head_loss(const float* normed, const ModelInput& in, Precision p, float* d_normed, float loss_scale);
  Tensor output_logits(const float* h, const ForwardOptions& options, const TokenBatch& tokens);
  void grow(int64_t rows, bool backward);

  ModelConfig config_;
  ParamStore params_;
  std::vector<Sublayer> sublayers_;  // 2 per layer: mixer, FFN
  std::vector<int> final_sources_;   // AttnRes before the final norm
  std::function<void(int64_t)> gradient_hook_;
  // Flat offsets of each decoder layer's first parameter, and of the first after the layers.
  std::vector<int64_t> layer_offsets_;
  int64_t head_offset_ = 0;
  Param* embed_ = nullptr;
  Linear lm_head_;  // over embed_ when tied
  RmsNorm final_norm_;
  std::vector<DecoderLayer> layers_;
  AttnRes out_res_;
  Linear patch_proj_;
  Param *patch_bias_ = nullptr, *row_embed_ = nullptr, *col_embed_ = nullptr;
  std::unique_ptr<MoonVit> moonvit_;  // vision.tower "moonvit" (SPEC §7.2), in place of the patch embedding

  // Activations of the last forward, grown to the largest batch and reused. The residual stream
  // holds x0 and, per layer, the stream (or AttnRes partial) after the mixer and after the FFN.
  int64_t rows_ = 0, capacity_ = 0, grad_capacity_ = 0;
  const ModelInput* input_ = nullptr;
  std::vector<Tensor> stream_, stream_grad_;
  std::vector<Tensor> sublayer_in_;  // h (AttnRes output) per sublayer; unused without AttnRes
  std::vector<Tensor> sublayer_u_;   // RMSNorm(h) per sublayer: the mixer's / FFN's input
  Tensor sublayer_out_, d_u_, d_h_, final_h_, final_normed_, d_final_, logits_chunk_;
  std::vector<int64_t> patch_rows_;  // rows that hold image patches (for the vision gradients)
  std::vector<int32_t> embedded_ids_;  // the embedding backward's token ids, -1 at patch rows
  std::vector<std::pair<int64_t, int64_t>> patch_grid_;  // (grid row, grid column) of each patch
  Tensor patches_;                   // [patch rows, P·P·C] normalised pixels (MoonViT: its patches)
  std::vector<TowerImage> tower_images_;  // MoonViT's images of the last forward, over patches_
  Tensor tower_rows_;                     // [image rows, d]: MoonViT's output, then its gradient
  std::vector<LayerCache*> slots_;  // one layer's cache slot per sequence, during a cached forward
  std::vector<const float*> sources_;  // an AttnRes's stream entries, during a forward
  Workspace workspace_;             // every layer's and kernel's scratch (core/workspace.h)
  ModelTimings timings_;
  std::vector<std::unique_ptr<ExpertExchange>> exchanges_;
  std::unique_ptr<ExpertOffload> offload_;  // last: its I/O thread stops before the layers go
};

// Writes config.json, the weights (in `dtype`, save_model_weights: one file or shards, a tensor at
// a time) and, when given, the tokenizer's text as tokenizer.json into a new directory that
// atomically replaces `dir`: Model::save, and `hyla init` of a model of any size.
void save_model_directory(const std::filesystem::path& dir, const ModelConfig& config, const ModelWeights& weights,
                          DType dtype, std::string_view tokenizer_json = {});

}  // namespace hyla
