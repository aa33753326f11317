#include "hyla/plan/comm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "hyla/core/error.h"
#include "hyla/plan/plan.h"

namespace hyla {

const std::vector<Fabric>& known_fabrics() {
  // Per GPU, one direction: NVLink 4 (H100/H200) 900 GB/s and NVLink 5 (B200) 1.8 TB/s both ways;
  // one 400 or 200 Gb/s NIC per GPU. Latencies are NCCL's own per-step ring estimates for large
  // messages (src/graph/tuning.cc, hwLat, Ring/Simple: NVLink 3.4 us, network 9.6 us).
  static const std::vector<Fabric> kFabrics = {
      {"nvlink4", 450e9, 3.4e-6},   {"nvlink5", 900e9, 3.4e-6}, {"ib-ndr400", 50e9, 9.6e-6},
      {"ib-hdr200", 25e9, 9.6e-6}, {"roce-400", 50e9, 9.6e-6},
  };
  return kFabrics;
}

namespace {

double non_negative_number(const std::string& field, const std::string& text, const std::string& option) {
  char* end = nullptr;
  const double value = std::strtod(field.c_str(), &end);
  HYLA_CHECK(!field.empty() && end == field.c_str() + field.size() && std::isfinite(value) && value >= 0,
             "{} {}: '{}' is not a number >= 0 (expected custom:GBps[,latency_us])", option, text, field);
  return value;
}

Fabric parse_custom(const std::string& text, const std::string& spec, const std::string& option) {
  const size_t comma = spec.find(',');
  const double gbps = non_negative_number(spec.substr(0, comma), text, option);
  HYLA_CHECK(gbps > 0, "{} {}: the bandwidth must be > 0 GB/s", option, text);
  const double latency_us = comma == std::string::npos ? 0 : non_negative_number(spec.substr(comma + 1), text, option);
  return {text, gbps * 1e9, latency_us * 1e-6};
}

// A ring all-reduce of `bytes` over `ranks` GPUs, `per_domain` of them in each NVLink domain,
// counted in its hierarchical form: a reduce-scatter inside the domain, an all-reduce of each
// GPU's 1/per_domain share across the D domains (every GPU on its own NIC), an all-gather inside
// the domain. Together that is the flat ring's 2 (n − 1)/n · bytes per GPU, of which only
// 2 (D − 1)/D · bytes / per_domain crosses a NIC (NCCL's rings over rail-connected nodes load each
// NIC the same). The buckets follow one another through the ring, so its steps' latency is paid
// once per step, not once per bucket.
LinkTraffic ring_all_reduce(double bytes, int64_t ranks, int64_t per_domain) {
  const double g = double(per_domain), domains = double(ranks) / g;
  LinkTraffic t;
  t.nvlink_bytes = 2 * (g - 1) / g * bytes;
  t.scale_out_bytes = 2 * (domains - 1) / domains * bytes / g;
  t.nvlink_steps = 2 * (g - 1);
  t.scale_out_steps = 2 * (domains - 1);
  return t;
}

void validate(const ModelConfig& c, const CommOptions& o, int64_t moe_layers) {
  HYLA_CHECK(o.dp >= 1, "--dp {}: must be at least 1", o.dp);
  HYLA_CHECK(o.ep >= 1, "--ep {}: must be at least 1", o.ep);
  HYLA_CHECK(o.ep == 1 || moe_layers > 0, "--ep {}: the config has no MoE layers to spread", o.ep);
  HYLA_CHECK(c.moe.num_experts % o.ep == 0,
             "--ep {}: must divide the {} routed experts (each GPU of a group holds E / EP of them)", o.ep,
             c.moe.num_experts);
  HYLA_CHECK(o.nvlink_domain >= 1, "--nvlink-domain {}: must be at least 1", o.nvlink_domain);
  HYLA_CHECK(o.target_share > 0 && o.target_share < 1, "--comm-target {}: must lie in (0, 1)", o.target_share);
  HYLA_CHECK(std::isfinite(o.batch_tokens) && o.batch_tokens >= double(o.gpus()),
             "--batch-tokens {}: must give every one of the {} GPUs at least one token", o.batch_tokens, o.gpus());
}

}  // namespace

Fabric parse_fabric(const std::string& text, const std::string& option) {
  const std::string custom = "custom:";
  if (text.rfind(custom, 0) == 0) return parse_custom(text, text.substr(custom.size()), option);
  std::string names;
  for (const Fabric& f : known_fabrics()) {
    if (f.name == text) return f;
    names += f.name + ", ";
  }
  fail("{}: unknown fabric '{}' (known: {}custom:GBps[,latency_us])", option, text, names);
}

double LinkTraffic::latency_seconds(const Fabric& nvlink, const Fabric& scale_out) const {
  return nvlink_steps * nvlink.latency_seconds + scale_out_steps * scale_out.latency_seconds;
}

double LinkTraffic::seconds(const Fabric& nvlink, const Fabric& scale_out) const {
  return nvlink_bytes / nvlink.bandwidth_bytes_per_s + scale_out_bytes / scale_out.bandwidth_bytes_per_s +
         latency_seconds(nvlink, scale_out);
}

LinkTraffic& LinkTraffic::operator+=(const LinkTraffic& other) {
  nvlink_bytes += other.nvlink_bytes, scale_out_bytes += other.scale_out_bytes;
  nvlink_steps += other.nvlink_steps, scale_out_steps += other.scale_out_steps;
  return *this;
}

double Communication::step_seconds_full_overlap() const { return std::max(compute_seconds, comm_seconds()); }

double Communication::exposed_share_full_overlap() const {
  return (step_seconds_full_overlap() - compute_seconds) / step_seconds_full_overlap();
}

Communication plan_communication(const Plan& p) {
  const ModelConfig& c = p.config;
  const CommOptions& o = *p.options.comm;
  const int64_t moe_layers = c.num_hidden_layers - c.moe.first_k_dense_replace;
  validate(c, o, moe_layers);
  const int64_t N = o.gpus(), domain = o.nvlink_domain;
  Communication x;
  x.gpus = N;
  x.tokens_per_gpu = o.batch_tokens / double(N);
  x.micro_batches = int64_t(std::ceil(x.tokens_per_gpu / double(p.options.train_seq_len)));

  // A token sends its k rows to the GPUs holding its experts (dispatch) and gets k rows back
  // (combine); with experts spread evenly, (EP − 1)/EP of them live on another GPU. The EP groups
  // are consecutive GPUs, so g = min(EP, domain) of a group's GPUs share an NVLink domain: the rows
  // for the g − 1 peers there stay on NVLink, the rows for the other EP − g leave through the NIC.
  // Backward sends the gradients of the same rows the same way. Each all-to-all is EP − 1 pairwise
  // steps.
  const MoeConfig& m = c.moe;
  x.expert_width = m.latent_dim > 0 ? m.latent_dim : c.hidden_size;
  const double EP = double(o.ep), k = double(m.num_experts_per_tok);
  const double rows_bytes = 2 * k * double(x.expert_width) * kAllToAllBytesPerValue;  // dispatch + combine
  x.all_to_all_bytes_per_token_layer = rows_bytes * (EP - 1) / EP;
  const int64_t ep_per_domain = std::min(o.ep, domain);
  const double token_layers = 2 * x.tokens_per_gpu * double(moe_layers);  // forward and backward
  const double all_to_alls = 2 * 2 * double(x.micro_batches) * double(moe_layers);
  x.all_to_all.nvlink_bytes = token_layers * rows_bytes * double(ep_per_domain - 1) / EP;
  x.all_to_all.scale_out_bytes = token_layers * rows_bytes * double(o.ep - ep_per_domain) / EP;
  x.all_to_all.nvlink_steps = all_to_alls * double(ep_per_domain - 1);
  x.all_to_all.scale_out_steps = all_to_alls * double(o.ep - ep_per_domain);

  // Gradients: every GPU holds all but the routed experts, reduced over all N GPUs; its E/EP
  // experts are held by the DP GPUs at the same place in each group (EP apart), reduced over
  // those. ZeRO-1's reduce-scatter of the gradients plus all-gather of the weights moves the same
  // bytes as the all-reduce.
  const int64_t routed = p.params.total[int(Component::RoutedExperts)];
  x.replicated_params = p.params.total_sum() - routed;
  x.expert_params_per_gpu = routed / o.ep;
  x.replicated_gradients =
      ring_all_reduce(kGradientBytesPerValue * double(x.replicated_params), N, std::min(N, domain));
  const int64_t expert_replicas_per_domain = o.ep >= domain ? 1 : std::min(o.dp, domain / o.ep);
  x.expert_gradients =
      ring_all_reduce(kGradientBytesPerValue * double(x.expert_params_per_gpu), o.dp, expert_replicas_per_domain);

  // ZeRO-1 (hyla's sharding): bf16 weights and gradients whole, the f32 master weights and AdamW
  // moments sharded over the GPUs that reduce them.
  const double whole = 4, sharded = kTrainingBytesPerParam - whole;
  x.state_bytes_per_gpu = double(x.replicated_params) * (whole + sharded / double(N)) +
                          double(x.expert_params_per_gpu) * (whole + sharded / double(o.dp));

  x.compute_seconds =
      x.tokens_per_gpu * p.training.flops_per_trained_token / (p.options.gpu.bf16_flops * p.options.mfu);
  x.all_to_all_seconds = x.all_to_all.seconds(o.nvlink, o.scale_out);
  x.gradient_seconds = x.replicated_gradients.seconds(o.nvlink, o.scale_out) +
                       x.expert_gradients.seconds(o.nvlink, o.scale_out);
  LinkTraffic all = x.all_to_all;
  all += x.replicated_gradients;
  all += x.expert_gradients;
  x.latency_seconds = all.latency_seconds(o.nvlink, o.scale_out);

  // Without overlap communication is share s of the step when comm = s/(1 − s) · compute. Solve
  // comm = bytes on the sized link / bandwidth + the rest (the other link, every latency) for
  // the bandwidth.
  const double allowed = o.target_share / (1 - o.target_share) * x.compute_seconds;
  x.needed_on_nvlink = all.scale_out_bytes == 0;
  const double sized_bytes = x.needed_on_nvlink ? all.nvlink_bytes : all.scale_out_bytes;
  const double rest =
      x.latency_seconds + (x.needed_on_nvlink ? 0 : all.nvlink_bytes / o.nvlink.bandwidth_bytes_per_s);
  x.needed_bandwidth_bytes_per_s = sized_bytes == 0 ? 0
                                   : allowed > rest ? sized_bytes / (allowed - rest)
                                                    : std::numeric_limits<double>::infinity();
  return x;
}

}  // namespace hyla
