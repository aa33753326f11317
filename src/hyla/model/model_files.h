#pragma once
// Where a model's config and weights come from: a model directory (config.json and safetensors,
// SPEC §8), a llama.cpp GGUF file (model/gguf_model.h), or a Hugging Face checkpoint directory
// (model/hf_checkpoint.h), of any architecture hyla implements (model/arch/architecture.h), with,
// optionally, a vision tower from a llama.cpp mmproj file (model/moonvit_gguf.h). Every command
// that loads a model or its config goes through here, so each format is recognised in one place
// and every config is checked against its architecture's rules.
#include <filesystem>
#include <memory>

#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"
#include "hyla/model/gguf_model.h"

namespace hyla {

struct ModelFiles {
  ModelConfig config;
  std::shared_ptr<const ModelWeights> weights;
  enum class Format { Hyla, Gguf, HuggingFace } format = Format::Hyla;
};

struct ModelFilesOptions {
  GgufQuantized gguf_quantized = GgufQuantized::Converted;  // weights_from_gguf's
  // A llama.cpp mmproj file (model/moonvit_gguf.h) whose vision tower joins a text-only model.
  std::filesystem::path mmproj;
};

ModelFiles open_model_files(const std::filesystem::path& path, const ModelFilesOptions& options = {});

// Only the config: of a config.json file (hyla's or a checkpoint's), a model or checkpoint
// directory, or a GGUF file.
ModelConfig model_config_of(const std::filesystem::path& path);

}  // namespace hyla
