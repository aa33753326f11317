#include "hyla/model/kda_mixer.h"

namespace hyla {

KdaMixer::KdaMixer(ParamStore& store, const std::string& prefix, const ModelConfig& config)
    : config_(config), heads_(config.kda.num_heads), head_dim_(config.kda.head_dim) {
  const int64_t d = config.hidden_size, HK = heads_ * head_dim_;
  const Component c = Component::Kda;
  q_proj_ = Linear(store, prefix + "q_proj", d, HK, c);
  k_proj_ = Linear(store, prefix + "k_proj", d, HK, c);
  v_proj_ = Linear(store, prefix + "v_proj", d, HK, c);
  f_proj_ = Linear(store, prefix + "f_proj", d, HK, c);
  g_proj_ = Linear(store, prefix + "g_proj", d, HK, c);
  b_proj_ = Linear(store, prefix + "b_proj", d, heads_, c);
  o_proj_ = Linear(store, prefix + "o_proj", HK, d, c, Init::NormalOutput);
  const Shape conv{HK, 1, config.kda.conv_kernel};
  q_conv_ = &store.add(prefix + "q_conv1d.weight", conv, Init::ConvUniform, c);
  k_conv_ = &store.add(prefix + "k_conv1d.weight", conv, Init::ConvUniform, c);
  v_conv_ = &store.add(prefix + "v_conv1d.weight", conv, Init::ConvUniform, c);
  a_log_ = &store.add(prefix + "A_log", {heads_}, Init::ALog, c, /*weight_decay=*/false);
  dt_bias_ = &store.add(prefix + "dt_bias", {HK}, Init::DtBias, c, /*weight_decay=*/false);
  o_norm_ = RmsNorm(store, prefix + "o_norm", head_dim_, c, float(config.rms_norm_eps));
}

}  // namespace hyla
