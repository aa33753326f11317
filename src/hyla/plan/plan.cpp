#include "hyla/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "hyla/core/error.h"

namespace hyla {

DecodeRate DecodeStep::rate(double step_seconds) const {
  return {1 / step_seconds, double(batch) / step_seconds, double(batch) / step_seconds / double(gpus)};
}

DecodeRate DecodeStep::upper_bound() const { return rate(std::max(bandwidth_seconds, compute_seconds)); }

namespace {

int64_t gpus_for(double bytes, double usable_bytes_per_gpu) {
  return std::max<int64_t>(1, int64_t(std::ceil(bytes / usable_bytes_per_gpu)));
}

void validate(const ModelConfig& c, const PlanOptions& o) {
  const int64_t max_pos = c.max_position_embeddings;
  HYLA_CHECK(o.context >= 0 && o.context <= max_pos,
             "--context {}: must lie in [1, max_position_embeddings = {}] (positions past it are undefined)", o.context,
             max_pos);
  HYLA_CHECK(o.batch >= 1, "--batch {}: must be at least 1", o.batch);
  HYLA_CHECK(o.mfu > 0 && o.mfu <= 1, "--mfu {}: must lie in (0, 1]", o.mfu);
  HYLA_CHECK(o.train_tokens > 0 && std::isfinite(o.train_tokens), "--train-tokens {}: must be > 0", o.train_tokens);
  HYLA_CHECK(o.train_seq_len >= 1 && o.train_seq_len <= max_pos,
             "--train-seq-len {}: must lie in [1, max_position_embeddings = {}]", o.train_seq_len, max_pos);
  HYLA_CHECK(o.box_gpus >= 0, "--gpus {}: must be at least 1", o.box_gpus);
  for (const auto& [flag, value] : {std::pair{"--host-memory", o.host_memory_bytes}, {"--nvme", o.nvme_bytes}})
    HYLA_CHECK(value >= 0 && std::isfinite(value), "{} {}: must be >= 0", flag, value * 1e-9);
  for (const auto& [flag, value] : {std::pair{"--host-bandwidth", o.host_bandwidth_bytes_per_s},
                                    {"--nvme-bandwidth", o.nvme_bandwidth_bytes_per_s},
                                    {"--object-bandwidth", o.object_bandwidth_bytes_per_s}})
    HYLA_CHECK(value > 0 && std::isfinite(value), "{} {}: must be > 0", flag, value * 1e-9);
}

DecodeStep decode_step(const Plan& p) {
  const ModelConfig& c = p.config;
  const double bytes_per_param = p.options.weights.bytes_per_value;
  const double batch = double(p.options.batch);
  const int64_t lookup = c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size;
  const int64_t routed = p.params.total[int(Component::RoutedExperts)];
  DecodeStep d;
  d.batch = p.options.batch;
  d.gpus = p.deployment.min_gpus;
  d.dense_bytes = double(p.params.total_sum() - routed - lookup) * bytes_per_param;
  const int64_t moe_layers = c.num_hidden_layers - c.moe.first_k_dense_replace;
  if (moe_layers > 0) {
    // Balanced routing: each token picks k of E experts, so an expert escapes all B tokens with
    // probability (1 − k/E)^B.
    const double E = double(c.moe.num_experts), k = double(c.moe.num_experts_per_tok);
    d.experts_touched_per_layer = E * (1 - std::pow(1 - k / E, batch));
    const double expert_params = double(routed) / (double(moe_layers) * E);
    d.expert_bytes = double(moe_layers) * d.experts_touched_per_layer * expert_params * bytes_per_param;
  }
  d.cache_bytes = batch * (p.sequence.latent_cache_bytes + 2 * p.sequence.fixed_bytes());
  // Perfectly balanced: each GPU reads and multiplies its 1/N share, all at once.
  const double gpus = double(d.gpus);
  d.bandwidth_seconds = d.total_bytes() / (gpus * p.options.gpu.bandwidth_bytes_per_s);
  d.compute_seconds = batch * p.flops.decode() / (gpus * p.options.gpu.bf16_flops);
  return d;
}

Training training(const Plan& p) {
  const PlanOptions& o = p.options;
  const double params = double(p.params.total_sum());
  const double usable = p.deployment.usable_bytes_per_gpu;
  Training t;
  t.state_bytes = kTrainingBytesPerParam * params;
  t.zero3_gpus = gpus_for(t.state_bytes, usable);
  const double replicated = 4 * params, sharded = (kTrainingBytesPerParam - 4) * params;
  t.zero1_gpus = replicated < usable ? gpus_for(sharded, usable - replicated) : 0;
  t.flops_per_token = token_flops(p.config, p.params, o.train_seq_len);
  // Backward costs twice the forward for the weights and for attention alike.
  t.flops_per_trained_token = 6 * double(p.matmul_params) + 3 * t.flops_per_token.prefill_attention();
  t.flops = o.train_tokens * t.flops_per_trained_token;
  t.gpu_hours = t.flops / (o.gpu.bf16_flops * o.mfu) / 3600;
  return t;
}

}  // namespace

Plan make_plan(const ModelConfig& config, const PlanOptions& options) {
  validate(config, options);
  Plan p;
  p.config = config;
  p.options = options;
  if (p.options.context == 0) p.options.context = config.max_position_embeddings;
  const PlanOptions& o = p.options;

  p.params = count_parameters(config);
  p.matmul_params = matmul_parameters(config, p.params);
  p.weight_bytes = double(p.params.total_sum()) * o.weights.bytes_per_value;
  p.active_weight_bytes = double(p.params.active_sum()) * o.weights.bytes_per_value;
  p.sequence = sequence_memory(config, o.context, o.kv.bytes_per_value);
  p.flops = token_flops(config, p.params, o.context);

  p.deployment.usable_bytes_per_gpu = kUsableMemoryFraction * o.gpu.memory_bytes;
  p.deployment.needed_bytes = p.weight_bytes + double(o.batch) * p.sequence.total_bytes();
  p.deployment.min_gpus = gpus_for(p.deployment.needed_bytes, p.deployment.usable_bytes_per_gpu);

  p.prefill_flops = double(o.context) * p.flops.prefill();
  p.prefill_seconds = p.prefill_flops / (double(p.deployment.min_gpus) * o.gpu.bf16_flops * o.mfu);
  p.decode = decode_step(p);
  p.training = training(p);
  if (o.box_gpus > 0) p.experts = plan_expert_placement(p);
  if (o.comm) p.communication = plan_communication(p);
  if (o.hosts) {
    p.hosts = plan_hosts(p, *o.hosts);
    HostsOptions alone = *o.hosts;
    alone.hosts = 1;
    p.one_host = plan_hosts(p, alone);
  }
  return p;
}

}  // namespace hyla
