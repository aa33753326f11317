#pragma once
// The decoder (SPEC §2): embedding (and image patches, §7), layers of mixer + FFN joined by
// block attention residuals (§6) or the pre-norm residual, final norm and LM head.
#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "hyla/model/config.h"
#include "hyla/model/ffn.h"
#include "hyla/model/kda_mixer.h"
#include "hyla/model/layers.h"
#include "hyla/model/mla_mixer.h"
#include "hyla/model/params.h"

namespace hyla {

// One AttnRes aggregation point: a pseudo-query w and an RMSNorm weight (SPEC §6).
struct AttnResParam {
  Param* query = nullptr;
  RmsNorm norm;
  AttnResParam() = default;
  AttnResParam(ParamStore& store, const std::string& query_name, const std::string& norm_name, int64_t d, float eps);
};

struct VisionParams {
  Linear patch_proj;
  Param *patch_bias = nullptr, *row_embed = nullptr, *col_embed = nullptr;
};

struct DecoderLayer {
  RmsNorm input_norm, post_attention_norm;
  std::variant<std::unique_ptr<KdaMixer>, std::unique_ptr<MlaMixer>> mixer;
  std::variant<std::unique_ptr<DenseFfn>, std::unique_ptr<MoeFfn>> ffn;
  AttnResParam mixer_res, ffn_res;
};

class Model {
 public:
  // Registers every parameter; with `allocate` false only names and shapes exist (enough to
  // check a file or count a configuration too large to hold in memory).
  explicit Model(const ModelConfig& config, bool allocate = true);
  const ModelConfig& config() const { return config_; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  void initialize(uint64_t seed) { params_.initialize(config_, seed); }
  // Writes config.json, model.safetensors (weights in `dtype`) and copies of `extra_files`
  // (e.g. tokenizer.json) into a new directory that atomically replaces `dir`.
  void save(const std::filesystem::path& dir, DType dtype = DType::F32,
            const std::vector<std::filesystem::path>& extra_files = {}) const;
  // Loads config.json and the weights of a model directory.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir);

 private:
  ModelConfig config_;
  ParamStore params_;
  Param* embed_ = nullptr;
  Param* lm_head_ = nullptr;  // == embed_ when tied
  RmsNorm final_norm_;
  std::vector<DecoderLayer> layers_;
  AttnResParam out_res_;
  VisionParams vision_;
};

}  // namespace hyla
