#include "hyla/model/model_files.h"

#include <algorithm>
#include <charconv>

#include "hyla/io/json_fields.h"
#include "hyla/model/arch/architecture.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/hf_checkpoint.h"
#include "hyla/model/moonvit_gguf.h"

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

// Layer counts checked against the tensors before anything is sized from them: every layer the
// config declares holds a tensor named model.layers.N.… (hyla's and the Hugging Face checkpoints'
// name, after any "language_model." prefix). A config that lies costs a pass over the names.
void check_layers_held(const ModelConfig& config, const ModelWeights& weights, const std::string& config_path) {
  const std::vector<std::string> names = weights.names();
  const int64_t layers = config.num_hidden_layers;
  HYLA_CHECK(layers <= int64_t(names.size()), "{}: num_hidden_layers is {} but the weights hold only {} tensors",
             config_path, layers, names.size());
  std::vector<bool> held(size_t(layers), false);
  constexpr std::string_view kLayers = "model.layers.";
  for (const std::string& name : names) {
    const size_t at = name.find(kLayers);
    if (at == std::string::npos) continue;
    const char* first = name.data() + at + kLayers.size();
    int64_t l = -1;
    const auto [end, error] = std::from_chars(first, name.data() + name.size(), l);
    if (error == std::errc() && *end == '.' && l >= 0 && l < layers) held[size_t(l)] = true;
  }
  const auto missing = std::find(held.begin(), held.end(), false);
  HYLA_CHECK(missing == held.end(), "{}: num_hidden_layers is {} but the weights hold no tensor of layer {} "
             "(model.layers.{}.*): {} of the layers have tensors", config_path, layers, missing - held.begin(),
             missing - held.begin(), std::count(held.begin(), held.end(), true));
}

// The routed-expert count checked the same way, before a model names each expert's tensors: the
// first MoE layer holds expert num_experts − 1 and no expert num_experts.
void check_experts_held(const ModelConfig& config, const ModelWeights& weights, const std::string& source) {
  const int64_t layer = config.moe.first_k_dense_replace, experts = config.moe.num_experts;
  if (layer < 0 || layer >= config.num_hidden_layers || experts <= 0) return;
  const auto held = [&](int64_t e) {
    return weights.contains(fmt::format("model.layers.{}.mlp.experts.{}.down_proj.weight", layer, e));
  };
  HYLA_CHECK(held(experts - 1) && !held(experts),
             "{}: moe.num_experts is {} but layer {} holds {} (model.layers.{}.mlp.experts.N.*)", source, experts, layer,
             held(experts) ? fmt::format("expert {} too", experts) : fmt::format("no expert {}", experts - 1), layer);
}

// The vision tower of an mmproj file joined to a text model's config and weights.
void add_mmproj(const std::filesystem::path& mmproj, const std::string& model, ModelConfig& config,
                ModelWeights& weights) {
  std::error_code ec;
  HYLA_CHECK(std::filesystem::exists(mmproj, ec), "{}: no such file (--mmproj)", mmproj.string());
  HYLA_CHECK(is_gguf_file(mmproj), "{}: not an mmproj: not a file that starts with the GGUF magic", mmproj.string());
  const auto gguf = std::make_shared<const GgufFile>(mmproj);
  HYLA_CHECK(!config.vision.enabled, "{}: the model has a vision tower already; it takes no --mmproj {}", model,
             mmproj.string());
  config.vision = vision_config_from_mmproj(*gguf, config.hidden_size);
  config.validate(mmproj.string());
  add_mmproj_weights(gguf, config.vision, weights);
}

// A config.json file: hyla's own, or a Hugging Face checkpoint's (its architecture by model_type).
ModelConfig read_config_json(const std::string& path, bool& hf) {
  const nlohmann::json j = parse_json_file(path);
  hf = is_hf_config(j);
  if (hf) return config_from_hf(j, path);
  ModelConfig c = ModelConfig::from_json(j, path);
  check_architecture(c, path);
  return c;
}

}  // namespace

ModelFiles open_model_files(const std::filesystem::path& path, const ModelFilesOptions& options) {
  check_model_path(path);
  const std::string source = path.string();
  if (is_gguf_file(path)) {
    const auto gguf = std::make_shared<const GgufFile>(path);
    ModelConfig config = config_from_gguf(*gguf);
    ModelWeights weights = weights_from_gguf(gguf, config, options.gguf_quantized);
    if (!options.mmproj.empty()) add_mmproj(options.mmproj, source, config, weights);
    return {std::move(config), std::make_shared<const ModelWeights>(std::move(weights)), ModelFiles::Format::Gguf};
  }
  const std::string config_path = (path / "config.json").string();
  bool hf = false;
  ModelConfig config = read_config_json(config_path, hf);
  auto weights = std::make_shared<ModelWeights>(path);
  check_layers_held(config, *weights, config_path);
  if (!hf) {
    check_experts_held(config, *weights, config_path);
    if (!options.mmproj.empty()) add_mmproj(options.mmproj, source, config, *weights);
    return {std::move(config), std::move(weights), ModelFiles::Format::Hyla};
  }
  ModelWeights mapped = weights_from_hf(weights, config);
  check_experts_held(config, mapped, config_path);
  if (!options.mmproj.empty()) add_mmproj(options.mmproj, source, config, mapped);
  return {std::move(config), std::make_shared<const ModelWeights>(std::move(mapped)), ModelFiles::Format::HuggingFace};
}

ModelConfig model_config_of(const std::filesystem::path& path) {
  if (is_gguf_file(path)) return config_from_gguf(GgufFile(path));
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) check_model_path(path);  // a regular file is a config.json
  bool hf = false;
  return read_config_json(std::filesystem::is_directory(path) ? (path / "config.json").string() : path.string(), hf);
}

}  // namespace hyla
