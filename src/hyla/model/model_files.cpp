#include "hyla/model/model_files.h"

#include "hyla/model/kimi_gguf.h"

namespace hyla {

ModelFiles open_model_files(const std::filesystem::path& path) {
  if (is_gguf_file(path)) {
    const auto gguf = std::make_shared<const GgufFile>(path);
    ModelConfig config = config_from_gguf(*gguf);
    auto weights = std::make_shared<const ModelWeights>(weights_from_gguf(gguf, config));
    return {std::move(config), std::move(weights), true};
  }
  return {ModelConfig::load((path / "config.json").string()), std::make_shared<const ModelWeights>(path), false};
}

}  // namespace hyla
