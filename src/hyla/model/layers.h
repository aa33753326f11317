#pragma once
// Parameter-holding building blocks shared by the mixers and FFNs.
#include <string>

#include "hyla/model/params.h"

namespace hyla {

// y = x W^T with W [out, in] (SPEC: weights stored [out_features, in_features]).
struct Linear {
  Param* weight = nullptr;
  int64_t in = 0, out = 0;
  Linear() = default;
  Linear(ParamStore& store, const std::string& name, int64_t in_features, int64_t out_features, Component component,
         Init init = Init::Normal)
      : weight(&store.add(name + ".weight", {out_features, in_features}, init, component)),
        in(in_features),
        out(out_features) {}
};

// RMSNorm_w(x) = x / sqrt(mean(x^2) + eps) * w.
struct RmsNormParam {
  Param* weight = nullptr;
  int64_t dim = 0;
  RmsNormParam() = default;
  RmsNormParam(ParamStore& store, const std::string& name, int64_t dim_, Component component)
      : weight(&store.add(name + ".weight", {dim_}, Init::Ones, component, /*weight_decay=*/false)), dim(dim_) {}
};

}  // namespace hyla
