#include "hyla/model/mixers.h"

#include "hyla/model/state_spec.h"

namespace hyla {

Mixer make_mixer(ParamStore& store, const std::string& prefix, const ModelConfig& config, LayerType type) {
  if (type == LayerType::Kda) return std::make_unique<KdaMixer>(store, prefix, config);
  return std::make_unique<MlaMixer>(store, prefix, config, type);
}

StateSpec state_spec(const ModelConfig& config, LayerType type) {
  if (type == LayerType::Kda) return KdaMixer::state_spec(config);
  return MlaMixer::state_spec(config, type);
}

}  // namespace hyla
