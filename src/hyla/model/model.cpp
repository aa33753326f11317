#include "hyla/model/model.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "hyla/core/clock.h"
#include "hyla/core/team.h"
#include "hyla/core/threads.h"
#include "hyla/io/file.h"
#include "hyla/io/safetensors.h"
#include "hyla/kernels/cross_entropy.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/residual.h"
#include "hyla/kernels/skinny_gemm.h"
#include "hyla/model/model_files.h"

namespace hyla {
namespace fs = std::filesystem;

namespace {

// Forwards of up to this many rows (decoding) run on the decode team: their bf16 products are the
// skinny kernels, which fork through parallel_for; above it oneDNN's products run OpenMP threads.
constexpr int64_t kDecodeTeamRows = kSkinnyMaxRows;

// The ModelTimings part that sublayer s (2 per layer: mixer, FFN) of the config's model counts to.
double& sublayer_seconds(ModelTimings& timings, const ModelConfig& config, int64_t s) {
  if (s % 2 == 1) return timings.ffn;
  return config.layer_types[size_t(s / 2)] == LayerType::Kda ? timings.kda : timings.attention;
}

}  // namespace

Model::Model(const ModelConfig& config, bool allocate) : config_(config) {
  config_.validate();
  const int64_t d = config_.hidden_size;
  const float eps = float(config_.rms_norm_eps);
  embed_ = &params_.add("model.embed_tokens.weight", {config_.vocab_size, d}, Init::Normal, Component::Embeddings);
  if (config_.vision.enabled && config_.vision.tower == VisionTower::MoonVit) {
    moonvit_ = std::make_unique<MoonVit>(params_, config_.vision, d);
  } else if (config_.vision.enabled) {
    const VisionConfig& v = config_.vision;
    patch_proj_ = Linear(params_, "model.vision.patch_proj", v.patch_size * v.patch_size * v.channels, d,
                         Component::Vision, Init::Normal, WeightStorage::FloatOnly);
    patch_bias_ = &params_.add("model.vision.patch_proj.bias", {d}, Init::Zeros, Component::Vision, false);
    row_embed_ = &params_.add("model.vision.row_embed", {v.max_grid, d}, Init::Normal, Component::Vision);
    col_embed_ = &params_.add("model.vision.col_embed", {v.max_grid, d}, Init::Normal, Component::Vision);
  }
  layers_.resize(size_t(config_.num_hidden_layers));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    DecoderLayer& layer = layers_[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    layer.input_norm = RmsNorm(params_, p + "input_layernorm", d, Component::Norms, eps);
    layer.mixer = make_mixer(params_, p + "self_attn.", config_, config_.layer_types[size_t(l)]);
    layer.post_attention_norm = RmsNorm(params_, p + "post_attention_layernorm", d, Component::Norms, eps);
    if (config_.is_moe_layer(l)) layer.ffn = std::make_unique<MoeFfn>(params_, p + "mlp.", config_);
    else layer.ffn = std::make_unique<DenseFfn>(params_, p + "mlp.", config_);
    if (config_.attn_res.enabled) {
      layer.mixer_res = AttnRes(params_, p + "attn_res_query", p + "attn_res_norm", d, eps);
      layer.ffn_res = AttnRes(params_, p + "mlp_res_query", p + "mlp_res_norm", d, eps);
    }
  }
  final_norm_ = RmsNorm(params_, "model.norm", d, Component::Norms, eps);
  if (config_.attn_res.enabled) out_res_ = AttnRes(params_, "model.out_res_query", "model.out_res_norm", d, eps);
  if (config_.tie_word_embeddings) {
    // The LM head reads the embedding matrix [V, d]: a Linear d → V over the same parameter.
    lm_head_ = Linear::over(*embed_);
  } else {
    lm_head_ = Linear(params_, "lm_head", d, config_.vocab_size, Component::Embeddings);
  }
  // The residual wiring (SPEC §6). With AttnRes, a sublayer mixes the completed blocks and the
  // current block's partial sum, and its output starts (or extends) the partial sum; a new block
  // starts every attn_res.block_size layers. Without it, each sublayer reads and extends the stream.
  sublayers_.resize(size_t(2 * config_.num_hidden_layers));
  std::vector<int> blocks{0};
  int partial = -1;
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (config_.attn_res.enabled && l > 0 && l % config_.attn_res.block_size == 0) {
      blocks.push_back(partial);
      partial = -1;
    }
    for (int sub = 0; sub < 2; ++sub) {
      const int s = int(2 * l + sub);
      Sublayer& w = sublayers_[size_t(s)];
      if (config_.attn_res.enabled) {
        w.sources = blocks;
        if (partial >= 0) w.sources.push_back(partial);
        w.base = partial;
        partial = s + 1;
      } else {
        w.input = w.base = s;
      }
    }
  }
  if (config_.attn_res.enabled) {
    final_sources_ = blocks;
    final_sources_.push_back(partial);
  }
  if (allocate) params_.allocate();
}

void Model::initialize(uint64_t seed) {
  params_.initialize(config_, seed);
  params_.refresh_bf16();
}

void Model::save(const fs::path& dir, DType dtype, const fs::path& tokenizer) const {
  ModelWeights weights;
  for (auto& [name, t] : params_.named_values(dtype))
    weights.add({name, t.dtype(), t.shape(), 0, uint64_t(t.nbytes())}, "model", [t] { return t; });
  save_model_directory(dir, config_, weights, dtype, tokenizer.empty() ? std::string() : read_file(tokenizer));
}

void save_model_directory(const fs::path& dir, const ModelConfig& config, const ModelWeights& weights, DType dtype,
                          std::string_view tokenizer_json) {
  AtomicDirectory out(dir);
  write_file_atomic(out.temp() / "config.json", config.to_json().dump(2) + "\n");
  save_model_weights(out.temp(), weights, dtype);
  if (!tokenizer_json.empty()) write_file_atomic(out.temp() / "tokenizer.json", tokenizer_json);
  out.commit();
}

std::unique_ptr<Model> Model::load(const fs::path& dir, const ModelLoadOptions& options) {
  const ModelFiles files = open_model_files(
      dir, {.gguf_quantized = options.decode_quantized ? GgufQuantized::Decoded : GgufQuantized::InPlace,
            .mmproj = options.mmproj});
  const std::shared_ptr<const ModelWeights>& weights = files.weights;
  auto model = std::make_unique<Model>(files.config, /*allocate=*/false);
  model->params_.plan_storage(*weights, dir.string());
  HYLA_ASSERT(!(options.holds && options.offload_experts));
  if (options.holds) model->params_.hold_only(options.holds);
  if (options.offload_experts) model->params_.hold_only([](const Param& p) { return routed_expert_of(p.name) < 0; });
  if (options.bf16_matrices)
    for (const auto& p : model->params_.params()) p->bf16_only = p->bf16_suffices();
  model->params_.allocate();
  model->params_.load(*weights, dir.string());
  model->params_.refresh_bf16();
  if (options.offload_experts) {
    const std::vector<MoeFfn*> moe = model->moe_layers();
    model->offload_ = std::make_unique<ExpertOffload>(moe, weights, *options.offload_experts, dir.string());
    for (size_t i = 0; i < moe.size(); ++i) moe[i]->set_offload(model->offload_.get(), int(i));
  }
  return model;
}

void Model::grow(int64_t rows, bool backward) {
  rows_ = rows;
  const int64_t d = config_.hidden_size, L = config_.num_hidden_layers;
  if (rows > capacity_) {
    capacity_ = std::max<int64_t>(rows, 1);
    auto make = [&] { return Tensor::empty(DType::F32, {capacity_, d}); };
    stream_.clear(), sublayer_in_.clear(), sublayer_u_.clear();
    for (int64_t i = 0; i < 1 + 2 * L; ++i) stream_.push_back(make());
    for (int64_t i = 0; i < 2 * L; ++i) {
      sublayer_u_.push_back(make());
      if (config_.attn_res.enabled) sublayer_in_.push_back(make());
    }
    sublayer_out_ = make(), final_h_ = make(), final_normed_ = make();
  }
  if (backward && rows > grad_capacity_) {  // decoding and scoring never allocate gradients
    grad_capacity_ = std::max<int64_t>(rows, 1);
    auto make = [&] { return Tensor::empty(DType::F32, {grad_capacity_, d}); };
    stream_grad_.clear();
    for (int64_t i = 0; i < 1 + 2 * L; ++i) stream_grad_.push_back(make());
    d_u_ = make(), d_h_ = make(), d_final_ = make();
  }
}

void Model::embed(const ModelInput& in, Precision precision, bool save) {
  const int64_t N = in.tokens.rows, d = config_.hidden_size, V = config_.vocab_size;
  HYLA_CHECK(int64_t(in.ids.size()) == N, "model input: {} token ids for {} rows", in.ids.size(), N);
  HYLA_CHECK(in.targets.empty() || int64_t(in.targets.size()) == N, "model input: {} targets for {} rows",
             in.targets.size(), N);
  HYLA_CHECK(in.loss_weights.empty() || (!in.targets.empty() && in.loss_weights.size() == in.targets.size()),
             "model input: {} loss weights for {} targets", in.loss_weights.size(), in.targets.size());
  for (size_t r = 0; r < in.loss_weights.size(); ++r)
    HYLA_CHECK(std::isfinite(in.loss_weights[r]), "model input: loss weight {} at row {}", in.loss_weights[r], r);
  HYLA_CHECK(std::isfinite(in.temperature) && in.temperature > 0, "model input: temperature {} (the loss's) must be > 0",
             in.temperature);
  for (int64_t r = 0; r < N; ++r)
    HYLA_CHECK(in.ids[size_t(r)] >= 0 && in.ids[size_t(r)] < V, "model input: token id {} at row {} is outside [0, {})",
               in.ids[size_t(r)], r, V);
  for (int64_t r = 0; r < N; ++r)
    HYLA_CHECK(in.tokens.positions[size_t(r)] < config_.max_position_embeddings,
               "model input: position {} reaches max_position_embeddings ({})", in.tokens.positions[size_t(r)],
               config_.max_position_embeddings);
  float* x0 = stream_[0].data<float>();
  const float* table = embed_->v();
  gather_rows(table, d, in.ids.data(), N, x0);

  if (moonvit_) return embed_moonvit(in, precision, save);
  // Images: each patch row's embedding is W_patch · patch + b + row_embed[r] + col_embed[c].
  patch_rows_.clear();
  int64_t pads = 0;
  if (in.image_pad_id >= 0)
    for (int32_t id : in.ids) pads += id == in.image_pad_id;
  if (in.images.empty()) {
    HYLA_CHECK(pads == 0 || !config_.vision.enabled, "model input: {} <|image_pad|> rows but no images", pads);
    return;
  }
  HYLA_CHECK(config_.vision.enabled, "model input has images but vision.enabled is false");
  HYLA_CHECK(in.image_pad_id >= 0, "model input has images but no image_pad_id");
  const VisionConfig& v = config_.vision;
  const int64_t P = v.patch_size, patch = P * P * v.channels;
  std::vector<std::pair<int64_t, int64_t>> grid;  // (row, column) of each patch, in order
  for (size_t i = 0; i < in.images.size(); ++i) {
    const Image& img = in.images[i];
    HYLA_CHECK(img.channels == v.channels, "image {}: {} channels, the model reads {}", i, img.channels, v.channels);
    HYLA_CHECK(img.height > 0 && img.width > 0 && img.height % P == 0 && img.width % P == 0,
               "image {}: {}x{} is not a multiple of the patch size {}", i, img.height, img.width, P);
    HYLA_CHECK(img.height / P <= v.max_grid && img.width / P <= v.max_grid,
               "image {}: {}x{} patches exceed vision.max_grid {}", i, img.height / P, img.width / P, v.max_grid);
    HYLA_CHECK(int64_t(img.pixels.size()) == img.height * img.width * img.channels,
               "image {}: {} bytes for {}x{}x{}", i, img.pixels.size(), img.height, img.width, img.channels);
    for (int64_t gr = 0; gr < img.height / P; ++gr)
      for (int64_t gc = 0; gc < img.width / P; ++gc) grid.emplace_back(gr, gc);
  }
  HYLA_CHECK(pads == int64_t(grid.size()), "model input: {} <|image_pad|> rows but the images have {} patches", pads,
             grid.size());
  for (int64_t r = 0; r < N; ++r)
    if (in.ids[size_t(r)] == in.image_pad_id) patch_rows_.push_back(r);
  patches_ = Tensor::empty(DType::F32, {std::max<int64_t>(pads, 1), patch});
  int64_t k = 0;
  for (const Image& img : in.images)
    for (int64_t gr = 0; gr < img.height / P; ++gr)
      for (int64_t gc = 0; gc < img.width / P; ++gc, ++k) {
        float* out = patches_.data<float>() + k * patch;
        for (int64_t y = 0; y < P; ++y)
          for (int64_t x = 0; x < P; ++x)
            for (int64_t c = 0; c < img.channels; ++c) {
              const uint8_t px = img.pixels[size_t(((gr * P + y) * img.width + gc * P + x) * img.channels + c)];
              *out++ = (float(px) / 255.0f - 0.5f) / 0.5f;
            }
      }
  Tensor embedded = Tensor::empty(DType::F32, {pads, d});
  patch_proj_.forward(patches_.data<float>(), pads, embedded.data<float>(), Precision::F32);
  for (int64_t i = 0; i < pads; ++i) {
    float* row = x0 + patch_rows_[size_t(i)] * d;
    const float* e = embedded.data<float>() + i * d;
    const float* re = row_embed_->v() + grid[size_t(i)].first * d;
    const float* ce = col_embed_->v() + grid[size_t(i)].second * d;
    for (int64_t j = 0; j < d; ++j) row[j] = e[j] + patch_bias_->v()[j] + re[j] + ce[j];
  }
  patch_grid_ = grid;
}

// MoonViT (SPEC §7.2): each image's merged tokens, in order, take the <|image_pad|> rows.
void Model::embed_moonvit(const ModelInput& in, Precision precision, bool save) {
  const int64_t N = in.tokens.rows, d = config_.hidden_size;
  patch_rows_.clear();
  if (in.image_pad_id >= 0)
    for (int64_t r = 0; r < N; ++r)
      if (in.ids[size_t(r)] == in.image_pad_id) patch_rows_.push_back(r);
  const int64_t pads = int64_t(patch_rows_.size());
  if (in.images.empty()) {
    HYLA_CHECK(pads == 0, "model input: {} <|image_pad|> rows but no images", pads);
    return;
  }
  HYLA_CHECK(in.image_pad_id >= 0, "model input has images but no image_pad_id");
  const VisionConfig& v = config_.vision;
  const int64_t P = v.patch_size, values = moonvit_->patch_values();
  int64_t patches = 0;
  for (const Image& img : in.images) patches += (img.height / P) * (img.width / P);
  if (!patches_.defined() || patches_.numel() < std::max<int64_t>(patches, 1) * values)
    patches_ = Tensor::empty(DType::F32, {std::max<int64_t>(patches, 1), values});
  tower_images_.clear();
  int64_t tokens = 0, offset = 0;
  for (size_t i = 0; i < in.images.size(); ++i) {
    const TowerImage t = moonvit_patchify(in.images[i], v, fmt::format("image {}", i),
                                          patches_.data<float>() + offset * values);
    tower_images_.push_back(t);
    offset += t.grid_rows * t.grid_cols;
    tokens += moonvit_->tokens(t);
  }
  HYLA_CHECK(pads == tokens, "model input: {} <|image_pad|> rows but the images have {} tokens", pads, tokens);
  if (!tower_rows_.defined() || tower_rows_.numel() < std::max<int64_t>(pads, 1) * d)
    tower_rows_ = Tensor::empty(DType::F32, {std::max<int64_t>(pads, 1), d});
  const auto t0 = std::chrono::steady_clock::now();
  moonvit_->forward(tower_images_, tower_rows_.data<float>(), precision, workspace_, save);
  timings_.vision = seconds_since(t0);
  float* x0 = stream_[0].data<float>();
  for (int64_t i = 0; i < pads; ++i)
    std::memcpy(x0 + patch_rows_[size_t(i)] * d, tower_rows_.data<float>() + i * d, size_t(d) * sizeof(float));
}

Tensor Model::image_embeddings() const {
  HYLA_CHECK(moonvit_, "image embeddings: the model's vision tower is not moonvit");
  const int64_t rows = int64_t(patch_rows_.size()), d = config_.hidden_size;
  Tensor out = Tensor::empty(DType::F32, {rows, d});
  if (rows > 0) std::memcpy(out.data<float>(), tower_rows_.data<float>(), size_t(rows * d) * sizeof(float));
  return out;
}

const float* Model::body_forward(const ForwardContext& ctx, std::span<SequenceCache> caches) {
  const int64_t N = ctx.tokens.rows, d = config_.hidden_size, L = config_.num_hidden_layers;
  const bool attn_res = config_.attn_res.enabled, save = ctx.save_for_backward;
  auto values = [&](const std::vector<int>& ids) -> const std::vector<const float*>& {
    sources_.clear();
    for (int i : ids) sources_.push_back(stream_[size_t(i)].data<float>());
    return sources_;
  };
  for (int64_t l = 0; l < L; ++l) {
    DecoderLayer& layer = layers_[size_t(l)];
    for (int sub = 0; sub < 2; ++sub) {
      const int64_t s = 2 * l + sub;
      const Sublayer& wiring = sublayers_[size_t(s)];
      // The sublayer's input h: AttnRes over the blocks and the partial sum, or the stream.
      const float* h;
      if (attn_res) {
        AttnRes& res = sub == 0 ? layer.mixer_res : layer.ffn_res;
        res.forward(values(wiring.sources), N, sublayer_in_[size_t(s)].data<float>(), save, ctx.workspace);
        h = sublayer_in_[size_t(s)].data<float>();
      } else {
        h = stream_[size_t(wiring.input)].data<float>();
      }
      float* u = sublayer_u_[size_t(s)].data<float>();
      (sub == 0 ? layer.input_norm : layer.post_attention_norm).forward(h, N, u, save);
      float* out = sublayer_out_.data<float>();
      const auto t0 = std::chrono::steady_clock::now();
      if (sub == 0) {
        slots_.clear();
        for (SequenceCache& cache : caches) slots_.push_back(&cache.layers[size_t(l)]);
        std::visit([&](auto& mixer) { mixer->forward(u, out, ctx, slots_); }, layer.mixer);
      } else {
        std::visit([&](auto& ffn) { ffn->forward(u, out, ctx); }, layer.ffn);
      }
      sublayer_seconds(timings_, config_, s) += seconds_since(t0);
      // The new stream entry s + 1: the base entry (if any) + the sublayer's output.
      float* entry = stream_[size_t(s + 1)].data<float>();
      const float* prior = wiring.base >= 0 ? stream_[size_t(wiring.base)].data<float>() : nullptr;
      add_rows(out, prior, N, d, entry);
    }
  }
  if (!attn_res) return stream_[size_t(2 * L)].data<float>();
  out_res_.forward(values(final_sources_), N, final_h_.data<float>(), save, ctx.workspace);
  return final_h_.data<float>();
}

void Model::body_backward(const float* d_final) {
  const int64_t N = rows_, d = config_.hidden_size, L = config_.num_hidden_layers;
  const bool attn_res = config_.attn_res.enabled;
  for (int64_t i = 0; i < 1 + 2 * L; ++i) std::memset(stream_grad_[size_t(i)].raw(), 0, size_t(N * d) * 4);
  auto grads_of = [&](const std::vector<int>& ids) {
    std::vector<float*> g;
    for (int i : ids) g.push_back(stream_grad_[size_t(i)].data<float>());
    return g;
  };
  if (attn_res) out_res_.backward(d_final, grads_of(final_sources_), workspace_);
  else std::memcpy(stream_grad_[size_t(2 * L)].raw(), d_final, size_t(N * d) * 4);
  if (gradient_hook_) gradient_hook_(head_offset_);
  for (int64_t s = 2 * L - 1; s >= 0; --s) {
    DecoderLayer& layer = layers_[size_t(s / 2)];
    const bool mixer = s % 2 == 0;
    // entry = base + out: the entry's gradient is the output's, and flows to the base too.
    float* g = stream_grad_[size_t(s + 1)].data<float>();
    const int base = sublayers_[size_t(s)].base;
    if (base >= 0) accumulate_rows(g, N, d, stream_grad_[size_t(base)].data<float>());
    float* du = d_u_.data<float>();
    const auto t0 = std::chrono::steady_clock::now();
    if (mixer) std::visit([&](auto& m) { m->backward(g, du); }, layer.mixer);
    else std::visit([&](auto& f) { f->backward(g, du); }, layer.ffn);
    sublayer_seconds(timings_, config_, s) += seconds_since(t0);
    RmsNorm& norm = mixer ? layer.input_norm : layer.post_attention_norm;
    if (attn_res) {
      norm.backward(du, d_h_.data<float>(), /*accumulate=*/false, workspace_);
      (mixer ? layer.mixer_res : layer.ffn_res)
          .backward(d_h_.data<float>(), grads_of(sublayers_[size_t(s)].sources), workspace_);
    } else {
      norm.backward(du, stream_grad_[size_t(base)].data<float>(), /*accumulate=*/true, workspace_);  // h: the base entry
    }
    if (mixer && gradient_hook_) gradient_hook_(layer_offsets_[size_t(s / 2)]);
  }
  // The embedding rows (scatter-add by token id) and the image patches.
  const float* dx0 = stream_grad_[0].data<float>();
  float* dembed = embed_->g();
  const ModelInput& in = *input_;
  embedded_ids_.assign(in.ids.begin(), in.ids.end());
  for (int64_t r : patch_rows_) embedded_ids_[size_t(r)] = -1;  // a patch row's gradient goes to the patch projection
  scatter_add_rows(dx0, d, embedded_ids_.data(), N, dembed);
  if (patch_rows_.empty()) return;
  const int64_t pads = int64_t(patch_rows_.size());
  if (moonvit_) {
    for (int64_t i = 0; i < pads; ++i)
      std::memcpy(tower_rows_.data<float>() + i * d, dx0 + patch_rows_[size_t(i)] * d, size_t(d) * sizeof(float));
    moonvit_->backward(tower_rows_.data<float>(), workspace_);
    return;
  }
  Tensor dpatch = Tensor::empty(DType::F32, {pads, d});
  for (int64_t i = 0; i < pads; ++i) {
    const float* src = dx0 + patch_rows_[size_t(i)] * d;
    std::memcpy(dpatch.data<float>() + i * d, src, size_t(d) * 4);
    for (int64_t j = 0; j < d; ++j) {
      patch_bias_->g()[j] += src[j];
      row_embed_->g()[patch_grid_[size_t(i)].first * d + j] += src[j];
      col_embed_->g()[patch_grid_[size_t(i)].second * d + j] += src[j];
    }
  }
  patch_proj_.backward_weight(patches_.data<float>(), dpatch.data<float>(), pads, Precision::F32);
}

LossResult Model::head_loss(const float* normed, const ModelInput& in, Precision p, float* d_normed, float loss_scale) {
  const std::vector<int32_t>& targets = in.targets;
  const float* weights = in.loss_weights.empty() ? nullptr : in.loss_weights.data();
  const int64_t N = rows_, d = config_.hidden_size, V = config_.vocab_size;
  constexpr int64_t kChunk = 256;  // rows of logits held at once: [256, V], never [rows, V]
  LossResult result;
  for (int32_t t : targets) {
    HYLA_CHECK(t < V, "model input: target {} is outside [0, {})", t, V);
    result.targets += t >= 0;
  }
  if (!logits_chunk_.defined()) logits_chunk_ = Tensor::empty(DType::F32, {kChunk, V});
  const float grad_scale = result.targets ? loss_scale / float(result.targets) : 0.0f;
  const float logit_scale = 1.0f / in.temperature;
  double total = 0;
  for (int64_t r0 = 0; r0 < N; r0 += kChunk) {
    const int64_t n = std::min(kChunk, N - r0);
    float* logits = logits_chunk_.data<float>();
    lm_head_.forward(normed + r0 * d, n, logits, p);
    const int32_t* chunk_targets = targets.data() + r0;
    const float* chunk_weights = weights ? weights + r0 : nullptr;
    if (!d_normed) {
      total += cross_entropy_loss(logits, n, V, chunk_targets, chunk_weights, logit_scale);
    } else {  // each row's gradient scaled to its share of the mean
      total += cross_entropy_loss_and_gradient(logits, n, V, chunk_targets, chunk_weights, grad_scale, logit_scale);
      lm_head_.backward_input(logits, n, d_normed + r0 * d, p);
      lm_head_.backward_weight(normed + r0 * d, logits, n, p);
    }
  }
  result.loss = result.targets ? total / double(result.targets) : 0.0;
  return result;
}

void Model::check_input(const ModelInput& in, const ForwardOptions& options, std::span<SequenceCache> caches) const {
  const int64_t B = in.tokens.batch();
  if (options.backward) {
    HYLA_CHECK(!params_.has_quantized(), "model: int8 or MXFP4 weights serve inference only; train the "
                                         "floating-point model");
    HYLA_ASSERT(!in.targets.empty() && caches.empty());
  }
  if (options.outputs == Outputs::Rows)
    for (int64_t r : options.rows) HYLA_ASSERT(r >= 0 && r < in.tokens.rows);
  if (caches.empty()) return;
  HYLA_CHECK(int64_t(caches.size()) == B, "model forward: {} caches for {} sequences", caches.size(), B);
  HYLA_ASSERT(!options.backward);
  for (int64_t b = 0; b < B; ++b) {
    HYLA_ASSERT(caches[size_t(b)].layers.size() == layers_.size());
    HYLA_CHECK(in.tokens.length(b) > 0, "model forward: sequence {} has no new tokens", b);
    HYLA_CHECK(in.tokens.positions[size_t(in.tokens.starts[size_t(b)])] == caches[size_t(b)].tokens,
               "model forward: sequence {} continues at position {} but its cache holds {} tokens", b,
               in.tokens.positions[size_t(in.tokens.starts[size_t(b)])], caches[size_t(b)].tokens);
  }
}

ForwardResult Model::forward(const ModelInput& in, const ForwardOptions& options, std::span<SequenceCache> caches) {
  check_input(in, options, caches);
  // Decode-sized forwards run on the decode team (core/team.h), the rest on OpenMP; either with
  // the threads the box can give now.
  const ForwardThreadsScope threads(forward_threads(), !options.backward && in.tokens.rows <= kDecodeTeamRows);
  const auto t0 = std::chrono::steady_clock::now();
  timings_ = {};
  grow(in.tokens.rows, options.backward);
  input_ = &in;
  embed(in, options.precision, options.backward);
  const ForwardContext ctx{in.tokens, workspace_, options.precision, options.backward, options.loss_scale};
  if (offload_) offload_->count_tokens(in.tokens.rows);
  const float* h = body_forward(ctx, caches);
  for (int64_t b = 0; b < int64_t(caches.size()); ++b) caches[size_t(b)].tokens += in.tokens.length(b);
  ForwardResult result;
  if (options.outputs != Outputs::None) result.logits = output_logits(h, options, in.tokens);
  if (!in.targets.empty()) {
    final_norm_.forward(h, rows_, final_normed_.data<float>(), options.backward);
    float* d_normed = options.backward ? d_u_.data<float>() : nullptr;
    result.loss = head_loss(final_normed_.data<float>(), in, options.precision, d_normed, options.loss_scale);
    if (options.backward) {
      final_norm_.backward(d_u_.data<float>(), d_final_.data<float>(), false, workspace_);
      for (const DecoderLayer& layer : layers_)
        if (auto* moe = std::get_if<std::unique_ptr<MoeFfn>>(&layer.ffn)) result.loss.aux_loss += (*moe)->aux_loss();
      body_backward(d_final_.data<float>());
      if (gradient_hook_) gradient_hook_(0);
    }
  }
  timings_.total = seconds_since(t0);
  return result;
}

Tensor Model::output_logits(const float* h, const ForwardOptions& options, const TokenBatch& tokens) {
  const int64_t d = config_.hidden_size, V = config_.vocab_size;
  if (options.outputs == Outputs::All) {
    final_norm_.forward(h, rows_, final_normed_.data<float>(), false);
    Tensor out = Tensor::empty(DType::F32, {rows_, V});
    lm_head_.forward(final_normed_.data<float>(), rows_, out.data<float>(), options.precision);
    return out;
  }
  std::vector<int64_t> last;
  if (options.outputs == Outputs::LastOfEachSequence)
    for (int64_t b = 0; b < tokens.batch(); ++b) last.push_back(tokens.starts[size_t(b) + 1] - 1);
  const std::vector<int64_t>& rows = options.outputs == Outputs::Rows ? options.rows : last;
  const int64_t n = int64_t(rows.size());
  Tensor picked = Tensor::empty(DType::F32, {n, d});
  for (int64_t i = 0; i < n; ++i) std::memcpy(picked.data<float>() + i * d, h + rows[size_t(i)] * d, size_t(d) * 4);
  final_norm_.forward(picked.data<float>(), n, picked.data<float>(), false);
  Tensor out = Tensor::empty(DType::F32, {n, V});
  lm_head_.forward(picked.data<float>(), n, out.data<float>(), options.precision);
  return out;
}

void Model::set_gradient_hook(std::function<void(int64_t)> hook) {
  gradient_hook_ = std::move(hook);
  if (!gradient_hook_) return;
  // The flat buffers follow registration order: embeddings and vision, the layers in order, then
  // the final norm, out_res and lm_head. Each offset is where a group's held parameters start.
  const std::vector<std::unique_ptr<Param>>& all = params_.params();
  const int64_t L = config_.num_hidden_layers;
  layer_offsets_.assign(size_t(L), -1);
  head_offset_ = params_.numel();
  int64_t last_layer = -1;
  for (const auto& p : all) {
    if (!p->held || p->is_quantized()) continue;
    const int64_t offset = p->v() - params_.values();
    int64_t layer = L;  // after the layers
    if (p->name.rfind("model.layers.", 0) == 0) layer = std::stoll(p->name.substr(13));
    else if (last_layer < 0) continue;  // before the layers
    HYLA_ASSERT(layer >= last_layer);
    if (layer == L && head_offset_ == params_.numel()) head_offset_ = offset;
    if (layer < L && layer_offsets_[size_t(layer)] < 0) layer_offsets_[size_t(layer)] = offset;
    last_layer = layer;
  }
  for (int64_t l = L - 1; l >= 0; --l)  // a layer without held parameters starts where the next does
    if (layer_offsets_[size_t(l)] < 0) layer_offsets_[size_t(l)] = l + 1 < L ? layer_offsets_[size_t(l + 1)] : head_offset_;
}

void Model::update_balancing(Collective& collective) {
  const std::vector<MoeFfn*> layers = moe_layers();
  hyla::update_balancing(layers, collective);
}

std::vector<MoeFfn*> Model::moe_layers() const {
  std::vector<MoeFfn*> out;
  for (const DecoderLayer& layer : layers_)
    if (auto* moe = std::get_if<std::unique_ptr<MoeFfn>>(&layer.ffn)) out.push_back(moe->get());
  return out;
}

void Model::own_expert_exchanges(std::vector<std::unique_ptr<ExpertExchange>> exchanges) {
  const std::vector<MoeFfn*> layers = moe_layers();
  HYLA_ASSERT(exchanges.size() == layers.size());
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->set_exchange(*exchanges[i]);
  exchanges_ = std::move(exchanges);
}

void Model::set_expert_exchange(ExpertExchange& exchange) {
  for (DecoderLayer& layer : layers_)
    if (auto* moe = std::get_if<std::unique_ptr<MoeFfn>>(&layer.ffn)) (*moe)->set_exchange(exchange);
}

void Model::discard_routing() {
  for (DecoderLayer& layer : layers_)
    if (auto* moe = std::get_if<std::unique_ptr<MoeFfn>>(&layer.ffn)) (*moe)->discard_routing();
}

std::vector<MoeFfn::LoadStats> Model::load_stats() const {
  std::vector<MoeFfn::LoadStats> stats;
  for (const DecoderLayer& layer : layers_)
    if (auto* moe = std::get_if<std::unique_ptr<MoeFfn>>(&layer.ffn)) stats.push_back((*moe)->load_stats());
  return stats;
}

}  // namespace hyla
