#pragma once
// The mixer kinds: where a layer's kind (LayerType) becomes its mixer class. A new kind registers
// here and in mixers.cpp (the variant, make_mixer, state_spec); docs/architecture.md has the
// whole checklist.
#include <memory>
#include <string>
#include <variant>

#include "hyla/model/kda_mixer.h"
#include "hyla/model/mla_mixer.h"

namespace hyla {

using Mixer = std::variant<std::unique_ptr<KdaMixer>, std::unique_ptr<MlaMixer>>;

Mixer make_mixer(ParamStore& store, const std::string& prefix, const ModelConfig& config, LayerType type);

}  // namespace hyla
