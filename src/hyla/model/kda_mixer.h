#pragma once
// KDA mixer (SPEC §3): projections, short causal convs, gates, the gated delta rule, output
// norm and gate. The recurrence and its chunked forms live in kernels/kda.h.
#include <string>

#include "hyla/model/layers.h"

namespace hyla {

class KdaMixer {
 public:
  KdaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config);

 private:
  const ModelConfig& config_;
  int64_t heads_, head_dim_;
  // Registered in this order so that [q k v f g b] is one [5 H K + H, d] matrix.
  Linear q_proj_, k_proj_, v_proj_, f_proj_, g_proj_, b_proj_, o_proj_;
  Param *q_conv_, *k_conv_, *v_conv_, *a_log_, *dt_bias_;
  RmsNorm o_norm_;
};

}  // namespace hyla
