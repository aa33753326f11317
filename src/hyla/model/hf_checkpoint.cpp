#include "hyla/model/hf_checkpoint.h"

#include <map>

#include "hyla/core/error.h"
#include "hyla/model/arch/architecture.h"

namespace hyla {

bool is_hf_config(const nlohmann::json& j) {
  return j.is_object() && j.contains("model_type") && j["model_type"].is_string() && j["model_type"] != "hyla";
}

ModelConfig config_from_hf(const nlohmann::json& file, const std::string& config_path) {
  const std::string model_type = file.value("model_type", "");
  const Architecture* arch = architecture_of_hf(file);
  if (!arch) {
    std::string known;
    for (const Architecture* a : architectures())
      if (!a->hf_model_type.empty()) known += std::string(a->hf_model_type) + ", ";
    fail("{}: model_type \"{}\" is not an architecture hyla reads ({}or hyla's own)", config_path, model_type, known);
  }
  ModelConfig c = arch->config_from_hf(file, config_path);
  c.validate(config_path);
  check_architecture(c, config_path);
  return c;
}

ModelWeights weights_from_hf(std::shared_ptr<const ModelWeights> checkpoint, const ModelConfig& config) {
  const Architecture& arch = architecture(config.architecture);
  HYLA_CHECK(arch.hf_tensor, "architecture {} has no Hugging Face checkpoint format", arch.name);
  ModelWeights out;
  std::map<std::string, std::string> source_of;  // hyla's name → the checkpoint's
  for (const std::string& name : checkpoint->names()) {
    const std::optional<HfTensor> t = arch.hf_tensor(name, config, checkpoint->file_of(name));
    if (!t) continue;
    SafetensorsEntry e = checkpoint->entry(name);
    const std::string file = checkpoint->file_of(name);
    const auto [given, fresh] = source_of.emplace(t->name, name);
    HYLA_CHECK(fresh, "{}: tensors '{}' and '{}' are both hyla's '{}'", file, given->second, name, t->name);
    if (t->first_values) {
      const int64_t n = t->shape->numel();
      HYLA_CHECK(e.shape.numel() >= n, "{}: tensor '{}' has {} values, fewer than the {} its config needs", file, name,
                 e.shape.numel(), n);
      e.name = t->name;
      e.shape = *t->shape;
      out.add(e, file, [checkpoint, name, n] {
        const Tensor a = checkpoint->get(name);
        return a.reshape(Shape{a.numel()}).rows(0, n);
      });
      continue;
    }
    if (t->shape) {
      HYLA_CHECK(t->shape->numel() == e.shape.numel(), "{}: tensor '{}' has shape {}, the config needs {} values ({})",
                 file, name, e.shape.str(), t->shape->numel(), t->name);
      e.shape = *t->shape;
    }
    e.name = t->name;
    out.add(e, file, [checkpoint, name, shape = e.shape] { return checkpoint->get(name).reshape(shape); });
  }
  return out;
}

}  // namespace hyla
