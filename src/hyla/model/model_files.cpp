#include "hyla/model/model_files.h"

#include "hyla/io/json_fields.h"
#include "hyla/model/hf_config.h"
#include "hyla/model/kimi_gguf.h"
#include "hyla/model/kimi_hf.h"

namespace hyla {
namespace {

// A model path that is neither a GGUF file nor a directory, named for what it is (rather than
// failing later on "PATH/config.json: Not a directory").
void check_model_path(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  HYLA_CHECK(fs::exists(status), "{}: no such file or directory", path.string());
  if (fs::is_directory(status) || is_gguf_file(path)) return;
  HYLA_CHECK(fs::is_regular_file(status), "{}: not a model: neither a directory nor a regular file (a GGUF file)",
             path.string());
  const uintmax_t size = fs::file_size(path, ec);
  HYLA_CHECK(size >= 4, "{}: not a model: a file of {} bytes, too short for a GGUF file's magic", path.string(), size);
  fail("{}: not a model: a file that does not start with the GGUF magic \"GGUF\" (and not a model directory)",
       path.string());
}

}  // namespace

ModelFiles open_model_files(const std::filesystem::path& path, const ModelFilesOptions& options) {
  check_model_path(path);
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
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) check_model_path(path);  // a regular file is a config.json
  if (std::filesystem::is_directory(path)) return ModelConfig::load((path / "config.json").string());
  return ModelConfig::load(path.string());
}

}  // namespace hyla
