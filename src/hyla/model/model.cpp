#include "hyla/model/model.h"

#include "hyla/io/file.h"

namespace hyla {
namespace fs = std::filesystem;

AttnResParam::AttnResParam(ParamStore& store, const std::string& query_name, const std::string& norm_name, int64_t d,
                           float eps)
    : query(&store.add(query_name, {d}, Init::Zeros, Component::AttnRes, /*weight_decay=*/false)),
      norm(store, norm_name, d, Component::AttnRes, eps) {}

Model::Model(const ModelConfig& config, bool allocate) : config_(config) {
  config_.validate();
  const int64_t d = config_.hidden_size;
  embed_ = &params_.add("model.embed_tokens.weight", {config_.vocab_size, d}, Init::Normal, Component::Embeddings);
  if (config_.vision.enabled) {
    const VisionConfig& v = config_.vision;
    vision_.patch_proj = Linear(params_, "model.vision.patch_proj", v.patch_size * v.patch_size * v.channels, d,
                                Component::Vision);
    vision_.patch_bias = &params_.add("model.vision.patch_proj.bias", {d}, Init::Zeros, Component::Vision, false);
    vision_.row_embed = &params_.add("model.vision.row_embed", {v.max_grid, d}, Init::Normal, Component::Vision);
    vision_.col_embed = &params_.add("model.vision.col_embed", {v.max_grid, d}, Init::Normal, Component::Vision);
  }
  layers_.resize(size_t(config_.num_hidden_layers));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    DecoderLayer& layer = layers_[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    layer.input_norm = RmsNorm(params_, p + "input_layernorm", d, Component::Norms, float(config_.rms_norm_eps));
    const LayerType type = config_.layer_types[size_t(l)];
    if (type == LayerType::Kda) layer.mixer = std::make_unique<KdaMixer>(params_, p + "self_attn.", config_);
    else layer.mixer = std::make_unique<MlaMixer>(params_, p + "self_attn.", config_, type);
    layer.post_attention_norm = RmsNorm(params_, p + "post_attention_layernorm", d, Component::Norms, float(config_.rms_norm_eps));
    if (config_.is_moe_layer(l)) layer.ffn = std::make_unique<MoeFfn>(params_, p + "mlp.", config_);
    else layer.ffn = std::make_unique<DenseFfn>(params_, p + "mlp.", config_);
    if (config_.attn_res.enabled) {
      layer.mixer_res = AttnResParam(params_, p + "attn_res_query", p + "attn_res_norm", d, float(config_.rms_norm_eps));
      layer.ffn_res = AttnResParam(params_, p + "mlp_res_query", p + "mlp_res_norm", d, float(config_.rms_norm_eps));
    }
  }
  final_norm_ = RmsNorm(params_, "model.norm", d, Component::Norms, float(config_.rms_norm_eps));
  if (config_.attn_res.enabled) out_res_ = AttnResParam(params_, "model.out_res_query", "model.out_res_norm", d, float(config_.rms_norm_eps));
  lm_head_ = config_.tie_word_embeddings
                 ? embed_
                 : &params_.add("lm_head.weight", {config_.vocab_size, d}, Init::Normal, Component::Embeddings);
  if (allocate) params_.allocate();
}

void Model::save(const fs::path& dir, DType dtype, const std::vector<fs::path>& extra_files) const {
  AtomicDirectory out(dir);
  write_file_atomic(out.temp() / "config.json", config_.to_json().dump(2) + "\n");
  save_model_weights(out.temp(), params_.named_values(dtype));
  for (const fs::path& extra : extra_files) {
    std::error_code ec;
    fs::copy_file(extra, out.temp() / extra.filename(), ec);
    HYLA_CHECK(!ec, "{}: cannot copy into the model directory: {}", extra.string(), ec.message());
  }
  out.commit();
}

std::unique_ptr<Model> Model::load(const fs::path& dir) {
  const ModelConfig config = ModelConfig::load((dir / "config.json").string());
  auto model = std::make_unique<Model>(config);
  model->params_.load(ModelWeights(dir), dir.string());
  return model;
}

}  // namespace hyla
