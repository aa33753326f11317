#include "hyla/model/model_files.h"

#include "hyla/io/json_fields.h"
#include "hyla/model/hf_config.h"
#include "hyla/model/kimi_gguf.h"
#include "hyla/model/kimi_hf.h"

namespace hyla {

ModelFiles open_model_files(const std::filesystem::path& path, const ModelFilesOptions& options) {
  if (is_gguf_file(path)) {
    const auto gguf = std::make_shared<const GgufFile>(path);
    ModelConfig config = config_from_gguf(*gguf);
    auto weights = std::make_shared<const ModelWeights>(weights_from_gguf(gguf, config, options.gguf_quantized));
    return {std::move(config), std::move(weights), ModelFiles::Format::Gguf};
  }
  const std::string config_path = (path / "config.json").string();
  ModelConfig config = ModelConfig::load(config_path);
  auto weights = std::make_shared<const ModelWeights>(path);
  const nlohmann::json j = parse_json_file(config_path);
  if (!is_hf_config(j)) return {std::move(config), std::move(weights), ModelFiles::Format::Hyla};
  return {std::move(config), std::make_shared<const ModelWeights>(weights_from_hf(weights, config)),
          ModelFiles::Format::HuggingFace};
}

ModelConfig model_config_of(const std::filesystem::path& path) {
  if (is_gguf_file(path)) return config_from_gguf(GgufFile(path));
  if (std::filesystem::is_directory(path)) return ModelConfig::load((path / "config.json").string());
  return ModelConfig::load(path.string());
}

}  // namespace hyla
