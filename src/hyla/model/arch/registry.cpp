#include <array>

#include "hyla/core/error.h"
#include "hyla/model/arch/architecture.h"

namespace hyla {

// Defined in their architecture files.
extern const Architecture kHylaArchitecture, kKimiK3Architecture, kKimiLinearArchitecture, kLing3Architecture;

namespace {

const std::array<const Architecture*, 4> kArchitectures{&kHylaArchitecture, &kKimiK3Architecture,
                                                        &kKimiLinearArchitecture, &kLing3Architecture};

std::string names() {
  std::string out;
  for (const Architecture* a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a->name);
  return out;
}

}  // namespace

int64_t GgufKeys::uniform(std::string_view name) const {
  const std::vector<int64_t> v = integers(name);
  for (int64_t x : v) HYLA_CHECK(x == v[0], "{}: {} differs between layers; SPEC has one value", source(), key(name));
  return v.at(0);
}

void GgufKeyWriter::u32(std::string_view name, int64_t value) {
  metadata_[arch_ + "." + std::string(name)] = GgufValue::u32(uint32_t(value));
}
void GgufKeyWriter::f32(std::string_view name, double value) {
  metadata_[arch_ + "." + std::string(name)] = GgufValue::f32(float(value));
}
void GgufKeyWriter::boolean(std::string_view name, bool value) {
  metadata_[arch_ + "." + std::string(name)] = GgufValue::boolean(value);
}
void GgufKeyWriter::f32_array(std::string_view name, const std::vector<double>& values) {
  metadata_[arch_ + "." + std::string(name)] = GgufValue::of_array(GgufValueType::F32, nlohmann::json(values));
}
void GgufKeyWriter::u32_array(std::string_view name, const std::vector<int64_t>& values) {
  metadata_[arch_ + "." + std::string(name)] =
      GgufValue::of_array(GgufValueType::U32, nlohmann::json(values));
}

std::span<const Architecture* const> architectures() { return kArchitectures; }

const Architecture& architecture(std::string_view name) {
  for (const Architecture* a : kArchitectures)
    if (a->name == name) return *a;
  fail("architecture \"{}\" is not one hyla implements ({})", name, names());
}

const Architecture* architecture_of_hf(const nlohmann::json& config_json) {
  const std::string model_type = config_json.value("model_type", "");
  std::string model_class;
  if (config_json.contains("architectures") && config_json["architectures"].is_array() &&
      !config_json["architectures"].empty() && config_json["architectures"][0].is_string())
    model_class = config_json["architectures"][0];
  for (const Architecture* a : kArchitectures)
    if ((!a->hf_model_type.empty() && a->hf_model_type == model_type) || (!a->hf_class.empty() && a->hf_class == model_class))
      return a;
  return nullptr;
}

const Architecture* architecture_of_gguf(std::string_view gguf_arch) {
  for (const Architecture* a : kArchitectures)
    if (!a->gguf_arch.empty() && a->gguf_arch == gguf_arch) return a;
  return nullptr;
}

void check_architecture(const ModelConfig& config, const std::string& source) {
  const Architecture* arch = nullptr;
  for (const Architecture* a : kArchitectures)
    if (a->name == config.architecture) arch = a;
  HYLA_CHECK(arch, "{}: architecture \"{}\" is not one hyla implements ({})", source, config.architecture, names());
  arch->check(config, [&](bool ok, std::string_view what) {
    HYLA_CHECK(ok, "{}: not a {} model: {}", source, arch->name, what);
  });
}

}  // namespace hyla
