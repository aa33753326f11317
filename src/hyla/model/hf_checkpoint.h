#pragma once
// A Hugging Face checkpoint (config.json and safetensors shards) of an architecture hyla implements
// (model/arch/architecture.h), read as SPEC's config and tensors: the architecture is the one whose
// model_type the config.json names, and its tables say what each key and tensor is. Tensors stay
// views of the mapped shards.
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"

namespace hyla {

// Whether `j` is a Hugging Face config.json (a model_type other than "hyla").
bool is_hf_config(const nlohmann::json& j);

// The ModelConfig of a checkpoint's config.json (`config_path` names it in errors, and its directory
// holds any file beside it the architecture reads), validated, with `architecture` set.
ModelConfig config_from_hf(const nlohmann::json& j, const std::string& config_path);

// The checkpoint's tensors under hyla's names, reshaped as the architecture's table says; tensors
// it skips are left out, two tensors of one hyla name are an error.
ModelWeights weights_from_hf(std::shared_ptr<const ModelWeights> checkpoint, const ModelConfig& config);

}  // namespace hyla
