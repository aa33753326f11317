// hyla's own architecture: every option of SPEC, in its own model directory (config.json with
// model_type "hyla", safetensors). No published file format names it; a model of it that fits
// Kimi K3's or Kimi Linear's rules is exported by naming that architecture (`hyla convert
// --architecture`).
#include "hyla/model/arch/architecture.h"

namespace hyla {

extern const Architecture kHylaArchitecture;
const Architecture kHylaArchitecture{
    .name = "hyla",
    .summary = "SPEC §1–§7 with every option: KDA, MLA and sliding-window layers in any order, latent or full-width "
               "MoE with any balancing, block attention residuals, images as patches or through MoonViT",
    .check = [](const ModelConfig&, const Requirement&) {},
};

}  // namespace hyla
