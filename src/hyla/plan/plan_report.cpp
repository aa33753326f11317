#include "hyla/plan/plan_report.h"

#include <fmt/format.h>

#include <cmath>

#include "hyla/plan/layer_mix.h"
#include "hyla/plan/units.h"

namespace hyla {
using json = nlohmann::json;

namespace {

// One labelled figure with an optional explanation, aligned in columns.
void line(std::string& out, const std::string& label, const std::string& value, const std::string& note = "") {
  out += fmt::format("  {:<36} {:>10}", label, value);
  out += note.empty() ? "\n" : fmt::format("   {}\n", note);
}

std::string counted(int64_t n, const std::string& noun) { return grouped(n) + " " + noun + (n == 1 ? "" : "s"); }

void header(std::string& out, const Plan& p) {
  const ModelConfig& c = p.config;
  const PlanOptions& o = p.options;
  const LayerMix mix = layer_mix(c);
  out += fmt::format(
      "model: d {}, {} layers ({} kda, {} mla, {} swa), vocab {}, {} experts ({} routed + {} shared per token",
      c.hidden_size, c.num_hidden_layers, mix.kda, mix.mla, mix.swa, c.vocab_size, c.moe.num_experts,
      c.moe.num_experts_per_tok, c.moe.num_shared_experts);
  out += c.moe.latent_dim > 0 ? fmt::format(", latent {})\n", c.moe.latent_dim) : ")\n";
  out += fmt::format("options: context {}, weights {} ({}), kv cache {}, batch {}, mfu {}\n", grouped(o.context),
                     o.weights.name, o.weights.layout, o.kv.name, o.batch, o.mfu);
  out += fmt::format("gpu: {} ({} memory, {}, {} dense bf16)\n", o.gpu.name, si(o.gpu.memory_bytes, "B"),
                     si(o.gpu.bandwidth_bytes_per_s, "B/s"), si(o.gpu.bf16_flops, "FLOP/s"));
}

void parameters(std::string& out, const Plan& p) {
  out += fmt::format("\nparameters {:>32} {:>22}\n", "total", "active per token");
  for (int i = 0; i < kNumComponents; ++i)
    out += fmt::format("  {:<18} {:>22} {:>22}\n", component_name(Component(i)), grouped(p.params.total[i]),
                       grouped(p.params.active[i]));
  const int64_t total = p.params.total_sum(), active = p.params.active_sum();
  out += fmt::format("  {:<18} {:>22} {:>22}   ({} total, {} active)\n", "sum", grouped(total), grouped(active),
                     short_count(double(total)), short_count(double(active)));
}

void memory(std::string& out, const Plan& p) {
  const ModelConfig& c = p.config;
  const SequenceMemory& s = p.sequence;
  const LayerMix mix = layer_mix(c);
  out += "\nmemory\n";
  line(out, "weights, all experts resident", si(p.weight_bytes, "B"),
       fmt::format("{} params x {:.6g} B", grouped(p.params.total_sum()), p.options.weights.bytes_per_value));
  line(out, "weights one token uses (active)", si(p.active_weight_bytes, "B"),
       "not the deployment memory: every expert must be resident");
  line(out, fmt::format("per sequence at {}", counted(p.options.context, "token")), si(s.total_bytes(), "B"));
  line(out, "  latent cache (grows with tokens)", si(s.latent_cache_bytes, "B"),
       fmt::format("{} layers x {} values x {} B per token", mix.attention(), s.latent_values_per_token,
                   p.options.kv.bytes_per_value));
  line(out, "  kda states (fixed)", si(s.kda_state_bytes, "B"),
       fmt::format("{} layers x {} heads x {}x{} f32", mix.kda, c.kda.num_heads, c.kda.head_dim, c.kda.head_dim));
  line(out, "  kda conv tails (fixed)", si(s.conv_tail_bytes, "B"),
       fmt::format("{} layers x 3 x {} channels x {} f32", mix.kda, c.kda.num_heads * c.kda.head_dim,
                   c.kda.conv_kernel - 1));
  line(out, fmt::format("full MHA instead, same {} layers", mix.attention()), si(s.mha_attention_layers_bytes, "B"),
       fmt::format("{} values per token per layer", s.mha_values_per_token));
  line(out, fmt::format("full MHA in all {} layers", c.num_hidden_layers), si(s.mha_all_layers_bytes, "B"));
}

void deployment(std::string& out, const Plan& p) {
  const Deployment& d = p.deployment;
  const double per_gpu = d.needed_bytes / double(d.min_gpus);
  out += fmt::format("\ndeployment on {}\n", p.options.gpu.name);
  line(out, fmt::format("weights + {} x sequence state", p.options.batch), si(d.needed_bytes, "B"));
  line(out, "usable per GPU", si(d.usable_bytes_per_gpu, "B"),
       fmt::format("{:.0f}% of memory; the rest is headroom for runtime, buffers, activations",
                   kUsableMemoryFraction * 100));
  line(out, "min GPUs", grouped(d.min_gpus),
       fmt::format("{} each = {:.0f}% of memory", si(per_gpu, "B"), 100 * per_gpu / p.options.gpu.memory_bytes));
}

void compute(std::string& out, const Plan& p) {
  const TokenFlops& f = p.flops;
  out += fmt::format("\n{:<38} {:>14} {:>14}\n", "compute per token at context " + grouped(p.options.context),
                     "prefill (mean)", "decode");
  auto row = [&out](const std::string& label, double prefill, double decode, const std::string& note = "") {
    out += fmt::format("  {:<36} {:>14} {:>14}", label, si(prefill, "FLOP"), si(decode, "FLOP"));
    out += note.empty() ? "\n" : fmt::format("   {}\n", note);
  };
  row("weights", f.weights, f.weights, fmt::format("2 x {} matmul params", grouped(p.matmul_params)));
  row("latent attention", f.mla_prefill, f.mla_decode);
  row("kda", f.kda_prefill, f.kda_decode);
  row("total", f.prefill(), f.decode());
  line(out, fmt::format("prefill {}", counted(p.options.context, "token")), fmt::format("{:.3g} s", p.prefill_seconds),
       fmt::format("{:.2e} FLOP on {} at MFU {}", p.prefill_flops, counted(p.deployment.min_gpus, "GPU"),
                   p.options.mfu));
}

void decode(std::string& out, const Plan& p) {
  const DecodeStep& d = p.decode;
  const ModelConfig& c = p.config;
  const PlanOptions& o = p.options;
  const std::string gpus = counted(d.gpus, "GPU");
  out += fmt::format("\ndecode upper bound (batch {}, experts and weights spread over {}, all reading at once)\n", d.batch,
                     gpus);
  line(out, "bytes read per step", si(d.total_bytes(), "B"), fmt::format("each GPU reads 1/{} of it", d.gpus));
  line(out, "  dense weights (sharded)", si(d.dense_bytes, "B"), "all but routed experts and the embedding lookup");
  line(out, "  routed experts touched", si(d.expert_bytes, "B"),
       fmt::format("{:.1f} of {} per layer x {} MoE layers", d.experts_touched_per_layer, c.moe.num_experts,
                   c.num_hidden_layers - c.moe.first_k_dense_replace));
  line(out, "  caches and states", si(d.cache_bytes, "B"), "latent caches read, kda states read and written");
  line(out, "step time, memory bandwidth", duration(d.bandwidth_seconds),
       fmt::format("{} / ({} x {})", si(d.total_bytes(), "B"), gpus, si(o.gpu.bandwidth_bytes_per_s, "B/s")));
  line(out, "step time, compute at peak", duration(d.compute_seconds),
       fmt::format("{} x {} / ({} x {})", counted(d.batch, "token"), si(p.flops.decode(), "FLOP"), gpus,
                   si(o.gpu.bf16_flops, "FLOP/s")));
  auto rates = [&out](const std::string& label, const DecodeRate& r) {
    out += fmt::format("  {:<36} {:>12} {:>12} {:>12}\n", label, short_count(r.per_sequence), short_count(r.deployment),
                       short_count(r.per_gpu));
  };
  out += fmt::format("  {:<36} {:>12} {:>12} {:>12}\n", "tokens/s", "per sequence", "deployment", "per GPU");
  rates("memory-bandwidth bound", d.bandwidth_bound());
  rates("compute bound at peak", d.compute_bound());
  rates("upper bound", d.upper_bound());
  out += d.batch == 1 ? fmt::format("  (a step gives the one sequence a token: deployment = per sequence; per GPU = "
                                    "deployment / {})\n",
                                    d.gpus)
                      : fmt::format("  (a step gives each of the {} sequences a token: deployment = {} x per sequence; per "
                                    "GPU = deployment / {})\n",
                                    d.batch, d.batch, d.gpus);
}

void expert_tiers(std::string& out, const Plan& p) {
  const ExpertPlacement& x = *p.experts;
  const std::string gpus = counted(x.gpus, "GPU");
  out += fmt::format("\nexpert offload (a box of {} {}: experts fill HBM after everything else, then the tiers below)\n",
                     gpus, p.options.gpu.name);
  out += fmt::format("  {:<16} {:>12} {:>14} {:>12} {:>8}\n", "tier", "capacity", "bandwidth", "experts", "share");
  for (const MemoryTier& t : x.tiers)
    out += fmt::format("  {:<16} {:>12} {:>14} {:>12} {:>7.1f}%\n", t.name,
                       t.name == "object storage" ? "unbounded" : si(t.capacity_bytes, "B"),
                       si(t.bandwidth_bytes_per_s, "B/s"), si(t.expert_bytes, "B"), 100 * t.share);
  line(out, "experts a decode step reads", si(x.touched_bytes, "B"),
       fmt::format("{:.1f} per layer at batch {}", p.decode.experts_touched_per_layer, p.options.batch));
  line(out, "step, every touched expert in HBM", duration(x.resident_step_seconds),
       fmt::format("the box's bandwidth or compute bound ({} tokens/s per sequence)",
                   short_count(1 / x.resident_step_seconds)));
  line(out, "step, every touched expert fetched", duration(x.miss_seconds), "from the lower tiers, by share");
  const double needed = x.hit_rate_for_resident_speed();
  line(out, "hit rate for the resident speed", fmt::format("{:.2f}%", 100 * needed),
       "fetches of the misses take no longer than the step");
  out += fmt::format("  {:<36} {:>12} {:>12} {:>12}\n", "decode bound at hit rate", "per sequence", "deployment",
                     "per GPU");
  const auto rates = [&](const std::string& label, double hit_rate) {
    const double step = x.step_seconds(hit_rate), batch = double(p.options.batch);
    out += fmt::format("  {:<36} {:>12} {:>12} {:>12}\n", label, short_count(1 / step), short_count(batch / step),
                       short_count(batch / step / double(x.gpus)));
  };
  rates(fmt::format("{:.1f}% (uniform routing: HBM's share)", 100 * x.uniform_hit_rate()), x.uniform_hit_rate());
  for (const double h : {0.9, 0.99})
    if (h > x.uniform_hit_rate()) rates(fmt::format("{:.0f}%", 100 * h), h);
  if (needed > x.uniform_hit_rate()) rates(fmt::format("{:.2f}% (resident speed)", 100 * needed), needed);
}

void training(std::string& out, const Plan& p) {
  const Training& t = p.training;
  const double replicated = 4 * double(p.params.total_sum());
  out += fmt::format("\ntraining ({:.0f} B per parameter: bf16 weights + bf16 grads + f32 master + f32 AdamW m, v)\n",
                     kTrainingBytesPerParam);
  line(out, "model states", si(t.state_bytes, "B"));
  line(out, "ZeRO-3 (all states sharded)", grouped(t.zero3_gpus), t.zero3_gpus == 1 ? "GPU" : "GPUs");
  if (t.zero1_gpus > 0)
    line(out, "ZeRO-1 (optimizer sharded)", grouped(t.zero1_gpus), t.zero1_gpus == 1 ? "GPU" : "GPUs");
  else
    line(out, "ZeRO-1 (optimizer sharded)", "no",
         fmt::format("replicated bf16 weights + grads ({}) exceed a GPU: add model parallelism", si(replicated, "B")));
  line(out,
       fmt::format("{} tokens at sequence {}", short_count(p.options.train_tokens), grouped(p.options.train_seq_len)),
       short_count(t.gpu_hours), fmt::format("GPU-hours: {:.2e} FLOP at MFU {}", t.flops, p.options.mfu));
}

std::string fabric_note(const Fabric& f) {
  return fmt::format("{}, latency {} per step", f.name, duration(f.latency_seconds));
}

void communication(std::string& out, const Plan& p) {
  const Communication& x = *p.communication;
  const CommOptions& o = *p.options.comm;
  const ModelConfig& c = p.config;
  const int64_t moe_layers = c.num_hidden_layers - c.moe.first_k_dense_replace;
  out += fmt::format("\ncommunication (training on DP {} x EP {} = {}; TP = PP = 1)\n", o.dp, o.ep,
                     counted(x.gpus, "GPU"));
  line(out, "scale-out fabric, per GPU", si(o.scale_out.bandwidth_bytes_per_s, "B/s"), fabric_note(o.scale_out));
  line(out, fmt::format("NVLink, domains of {}", counted(o.nvlink_domain, "GPU")),
       si(o.nvlink.bandwidth_bytes_per_s, "B/s"), fabric_note(o.nvlink));
  line(out, "tokens per step", short_count(o.batch_tokens),
       fmt::format("{} per GPU, {} micro-batch{} of {}", short_count(x.tokens_per_gpu), grouped(x.micro_batches),
                   x.micro_batches == 1 ? "" : "es", grouped(p.options.train_seq_len)));
  line(out, "all-to-all per token per MoE layer", si(x.all_to_all_bytes_per_token_layer, "B"),
       fmt::format("dispatch + combine: 2 x {} rows x {} x {} B (bf16) x {}/{}; backward again",
                   c.moe.num_experts_per_tok, x.expert_width, kAllToAllBytesPerValue, o.ep - 1, o.ep));
  line(out, "all-to-all per GPU per step", si(x.all_to_all.bytes(), "B"),
       fmt::format("{} tokens x {} layers, forward and backward: {} over NVLink, {} over the NIC",
                   short_count(x.tokens_per_gpu), moe_layers, si(x.all_to_all.nvlink_bytes, "B"),
                   si(x.all_to_all.scale_out_bytes, "B")));
  line(out, "gradients per GPU per step", si(x.gradient_bytes(), "B"),
       fmt::format("ring all-reduce (or ZeRO-1's reduce-scatter + all-gather) of f32: 2 (n-1)/n x {} B x params",
                   kGradientBytesPerValue));
  const auto gradients = [&](const std::string& what, int64_t params, int64_t ranks, const LinkTraffic& t) {
    line(out, fmt::format("  {} params over {}", short_count(double(params)), counted(ranks, "GPU")),
         si(t.bytes(), "B"),
         fmt::format("{}: {} over NVLink, {} over the NIC", what, si(t.nvlink_bytes, "B"), si(t.scale_out_bytes, "B")));
  };
  gradients("all but the routed experts", x.replicated_params, x.gpus, x.replicated_gradients);
  gradients(fmt::format("its {} of {} experts in each layer", c.moe.num_experts / o.ep, c.moe.num_experts),
            x.expert_params_per_gpu, o.dp, x.expert_gradients);
  const double usable = p.deployment.usable_bytes_per_gpu;
  line(out, "model states per GPU (ZeRO-1)", si(x.state_bytes_per_gpu, "B"),
       x.state_bytes_per_gpu <= usable
           ? fmt::format("fits the {} usable", si(usable, "B"))
           : fmt::format("more than the {} usable: needs TP, PP or ZeRO-3 (not modelled)", si(usable, "B")));
  line(out, "compute per step", duration(x.compute_seconds),
       fmt::format("{} tokens x {} / ({} x MFU {})", short_count(x.tokens_per_gpu),
                   si(p.training.flops_per_trained_token, "FLOP"), si(p.options.gpu.bf16_flops, "FLOP/s"),
                   p.options.mfu));
  line(out, "communication per step", duration(x.comm_seconds()),
       fmt::format("all-to-all {} + gradients {}, of which latency {}", duration(x.all_to_all_seconds),
                   duration(x.gradient_seconds), duration(x.latency_seconds)));
  line(out, "step, no overlap", duration(x.step_seconds_no_overlap()),
       fmt::format("communication {:.1f}% of it", 100 * x.share_no_overlap()));
  line(out, "step, full overlap", duration(x.step_seconds_full_overlap()),
       x.communication_bound()
           ? fmt::format("bound by communication: {:.1f}% of it is communication compute cannot hide",
                         100 * x.exposed_share_full_overlap())
           : "bound by compute: communication hides behind it");
  const std::string sized = x.needed_on_nvlink ? "NVLink" : "scale-out";
  const std::string label = fmt::format("{} for communication <= {:g}%", sized, 100 * o.target_share);
  if (x.comm_seconds() == 0)
    line(out, label, "any", "nothing to communicate");
  else if (std::isinf(x.needed_bandwidth_bytes_per_s))
    line(out, label, "none", "latency and the other link alone take more than that");
  else
    line(out, label, si(x.needed_bandwidth_bytes_per_s, "B/s"), "per GPU, without overlap");
}

}  // namespace

void hosts(std::string& out, const Plan& p) {
  const HostsPlan& h = *p.hosts;
  const HostsPlan& one = *p.one_host;
  const HostsOptions& o = *p.options.hosts;
  out += fmt::format("\nacross {} hosts (dense half tensor-parallel, routed experts expert-parallel; {} dense, {} "
                     "experts; {} of RAM, {} memory bandwidth and {} each)\n",
                     o.hosts, o.dense_weights.name, o.expert_weights.name, si(o.memory_bytes, "B"),
                     si(o.bandwidth_bytes_per_s, "B/s"), si(o.flops, "FLOP/s"));
  line(out, "held per host", si(h.held_bytes(), "B"),
       fmt::format("dense {} + experts {} + state {} (batch {})", si(h.dense_bytes, "B"), si(h.expert_bytes, "B"),
                   si(h.state_bytes, "B"), p.options.batch));
  line(out, "experts resident", fmt::format("{:.1f}%", 100 * h.resident_expert_share),
       !h.fits_dense ? "the dense share and state alone do not fit"
       : h.resident_expert_share < 1 ? fmt::format("the rest read from disk at {}", si(o.disk_bandwidth_bytes_per_s, "B/s"))
                                     : "all in RAM");
  line(out, "collectives per token", grouped(h.collectives_per_token),
       fmt::format("{} sent per host per token; {} a message", si(h.sent_bytes_per_token, "B"),
                   duration(o.network.latency_seconds)));
  line(out, "experts read per MoE layer", fmt::format("{:.2f}", h.experts_read_per_layer),
       fmt::format("on the busiest host (of {} per token)", p.config.moe.num_experts_per_tok));
  line(out, "decode step", duration(h.step_seconds()),
       fmt::format("memory {} (compute {}) + disk {} + network {}", duration(h.memory_seconds),
                   duration(h.compute_seconds), duration(h.disk_seconds), duration(h.network_seconds)));
  line(out, "decode tokens/s per sequence", fmt::format("{:.2f}", h.decode_tokens_per_s_per_sequence()),
       fmt::format("one host alone: {:.2f} ({:.2f}x)", one.decode_tokens_per_s_per_sequence(),
                   h.decode_tokens_per_s_per_sequence() / one.decode_tokens_per_s_per_sequence()));
  line(out, "prefill tokens/s", fmt::format("{:.1f}", h.prefill_tokens_per_s()),
       fmt::format("one host alone: {:.1f}; network {:.0f}% of it", one.prefill_tokens_per_s(),
                   100 * h.prefill_network_seconds_per_token * h.prefill_tokens_per_s()));
}

std::string plan_text(const Plan& p) {
  std::string out;
  header(out, p);
  parameters(out, p);
  memory(out, p);
  deployment(out, p);
  compute(out, p);
  decode(out, p);
  if (p.experts) expert_tiers(out, p);
  training(out, p);
  if (p.communication) communication(out, p);
  if (p.hosts) hosts(out, p);
  return out;
}

json plan_json(const Plan& p) {
  const PlanOptions& o = p.options;
  json components = json::object();
  for (int i = 0; i < kNumComponents; ++i)
    components[component_name(Component(i))] = {{"total", p.params.total[i]}, {"active", p.params.active[i]}};
  json out = {
      {"context", o.context},
      {"weights", o.weights.name},
      {"weight_bytes_per_param", o.weights.bytes_per_value},
      {"kv", o.kv.name},
      {"batch", o.batch},
      {"gpu",
       {{"name", o.gpu.name},
        {"memory_bytes", o.gpu.memory_bytes},
        {"bandwidth_bytes_per_s", o.gpu.bandwidth_bytes_per_s},
        {"bf16_flops", o.gpu.bf16_flops}}},
      {"mfu", o.mfu},
      {"params_total", p.params.total_sum()},
      {"params_active", p.params.active_sum()},
      {"params_matmul", p.matmul_params},
      {"params_by_component", components},
      {"weight_bytes", p.weight_bytes},
      {"active_weight_bytes", p.active_weight_bytes},
      {"sequence_state_bytes", p.sequence.total_bytes()},
      {"latent_cache_bytes", p.sequence.latent_cache_bytes},
      {"kda_state_bytes", p.sequence.kda_state_bytes},
      {"conv_tail_bytes", p.sequence.conv_tail_bytes},
      {"mha_attention_layers_bytes", p.sequence.mha_attention_layers_bytes},
      {"mha_all_layers_bytes", p.sequence.mha_all_layers_bytes},
      {"usable_bytes_per_gpu", p.deployment.usable_bytes_per_gpu},
      {"needed_bytes", p.deployment.needed_bytes},
      {"min_gpus", p.deployment.min_gpus},
      {"prefill_flops_per_token", p.flops.prefill()},
      {"decode_flops_per_token", p.flops.decode()},
      {"prefill_flops", p.prefill_flops},
      {"prefill_seconds", p.prefill_seconds},
      {"decode_bytes_per_step", p.decode.total_bytes()},
      {"decode_experts_touched_per_layer", p.decode.experts_touched_per_layer},
      {"decode_bandwidth_seconds_per_step", p.decode.bandwidth_seconds},
      {"decode_compute_seconds_per_step", p.decode.compute_seconds},
      {"decode_bandwidth_tokens_per_s_per_gpu", p.decode.bandwidth_bound().per_gpu},
      {"decode_compute_tokens_per_s_per_gpu", p.decode.compute_bound().per_gpu},
      {"decode_tokens_per_s_per_gpu_upper_bound", p.decode.upper_bound().per_gpu},
      {"decode_tokens_per_s_per_sequence_upper_bound", p.decode.upper_bound().per_sequence},
      {"decode_tokens_per_s_deployment_upper_bound", p.decode.upper_bound().deployment},
      {"training_bytes_per_param", kTrainingBytesPerParam},
      {"training_state_bytes", p.training.state_bytes},
      {"training_gpus_zero3", p.training.zero3_gpus},
      {"training_gpus_zero1", p.training.zero1_gpus > 0 ? json(p.training.zero1_gpus) : json(nullptr)},
      {"train_tokens", o.train_tokens},
      {"train_seq_len", o.train_seq_len},
      {"training_flops", p.training.flops},
      {"training_gpu_hours", p.training.gpu_hours},
  };
  if (p.experts) {
    const ExpertPlacement& x = *p.experts;
    json tiers = json::array();
    for (const MemoryTier& t : x.tiers)
      tiers.push_back({{"name", t.name},
                       {"capacity_bytes", t.name == "object storage" ? json(nullptr) : json(t.capacity_bytes)},
                       {"bandwidth_bytes_per_s", t.bandwidth_bytes_per_s},
                       {"expert_bytes", t.expert_bytes},
                       {"share", t.share}});
    out["expert_offload"] = {{"gpus", x.gpus},
                             {"expert_bytes", x.expert_bytes},
                             {"tiers", tiers},
                             {"touched_bytes_per_step", x.touched_bytes},
                             {"resident_step_seconds", x.resident_step_seconds},
                             {"miss_step_seconds", x.miss_seconds},
                             {"uniform_hit_rate", x.uniform_hit_rate()},
                             {"hit_rate_for_resident_speed", x.hit_rate_for_resident_speed()},
                             {"decode_tokens_per_s_per_sequence_at_uniform_hit_rate",
                              1 / x.step_seconds(x.uniform_hit_rate())}};
  }
  if (p.hosts) {
    const auto hosts_json = [](const HostsPlan& h) {
      return json{{"hosts", h.hosts},
                  {"dense_bytes_per_host", h.dense_bytes},
                  {"expert_bytes_per_host", h.expert_bytes},
                  {"state_bytes_per_host", h.state_bytes},
                  {"held_bytes_per_host", h.held_bytes()},
                  {"resident_expert_share", h.resident_expert_share},
                  {"fits_dense", h.fits_dense},
                  {"collectives_per_token", h.collectives_per_token},
                  {"sent_bytes_per_token_per_host", h.sent_bytes_per_token},
                  {"experts_read_per_moe_layer", h.experts_read_per_layer},
                  {"decode_read_bytes", h.read_bytes},
                  {"decode_memory_seconds", h.memory_seconds},
                  {"decode_compute_seconds", h.compute_seconds},
                  {"decode_disk_seconds", h.disk_seconds},
                  {"decode_network_seconds", h.network_seconds},
                  {"decode_step_seconds", h.step_seconds()},
                  {"decode_tokens_per_s_per_sequence", h.decode_tokens_per_s_per_sequence()},
                  {"prefill_compute_seconds_per_token", h.prefill_compute_seconds_per_token},
                  {"prefill_network_seconds_per_token", h.prefill_network_seconds_per_token},
                  {"prefill_tokens_per_s", h.prefill_tokens_per_s()}};
    };
    const HostsOptions& o = *p.options.hosts;
    out["hosts"] = hosts_json(*p.hosts);
    out["hosts"]["one_host"] = hosts_json(*p.one_host);
    out["hosts"]["options"] = {{"network_bandwidth_bytes_per_s", o.network.bandwidth_bytes_per_s},
                               {"network_latency_seconds", o.network.latency_seconds},
                               {"memory_bytes", o.memory_bytes},
                               {"bandwidth_bytes_per_s", o.bandwidth_bytes_per_s},
                               {"flops", o.flops},
                               {"disk_bandwidth_bytes_per_s", o.disk_bandwidth_bytes_per_s},
                               {"dense_weights", o.dense_weights.name},
                               {"expert_weights", o.expert_weights.name}};
  }
  if (p.communication) {
    const Communication& x = *p.communication;
    const CommOptions& o = *p.options.comm;
    const auto fabric = [](const Fabric& f) {
      return json{{"name", f.name},
                  {"bandwidth_bytes_per_s", f.bandwidth_bytes_per_s},
                  {"latency_seconds", f.latency_seconds}};
    };
    const auto traffic = [](const LinkTraffic& t) {
      return json{{"bytes", t.bytes()}, {"nvlink_bytes", t.nvlink_bytes}, {"scale_out_bytes", t.scale_out_bytes}};
    };
    const bool reachable = std::isfinite(x.needed_bandwidth_bytes_per_s);
    out["communication"] = {
        {"dp", o.dp},
        {"ep", o.ep},
        {"gpus", x.gpus},
        {"scale_out", fabric(o.scale_out)},
        {"nvlink", fabric(o.nvlink)},
        {"nvlink_domain", o.nvlink_domain},
        {"batch_tokens", o.batch_tokens},
        {"tokens_per_gpu", x.tokens_per_gpu},
        {"micro_batches_per_gpu", x.micro_batches},
        {"expert_input_width", x.expert_width},
        {"all_to_all_bytes_per_token_per_moe_layer", x.all_to_all_bytes_per_token_layer},
        {"all_to_all_per_gpu_per_step", traffic(x.all_to_all)},
        {"gradient_bytes_per_gpu_per_step", x.gradient_bytes()},
        {"replicated_params", x.replicated_params},
        {"replicated_gradients_per_gpu_per_step", traffic(x.replicated_gradients)},
        {"expert_params_per_gpu", x.expert_params_per_gpu},
        {"expert_gradients_per_gpu_per_step", traffic(x.expert_gradients)},
        {"state_bytes_per_gpu_zero1", x.state_bytes_per_gpu},
        {"compute_seconds_per_step", x.compute_seconds},
        {"all_to_all_seconds_per_step", x.all_to_all_seconds},
        {"gradient_seconds_per_step", x.gradient_seconds},
        {"comm_seconds_per_step", x.comm_seconds()},
        {"latency_seconds_per_step", x.latency_seconds},
        {"step_seconds_no_overlap", x.step_seconds_no_overlap()},
        {"step_seconds_full_overlap", x.step_seconds_full_overlap()},
        {"comm_share_no_overlap", x.share_no_overlap()},
        {"exposed_comm_share_full_overlap", x.exposed_share_full_overlap()},
        {"bound", x.communication_bound() ? "communication" : "compute"},
        {"target_share", o.target_share},
        {"needed_bandwidth_bytes_per_s", reachable ? json(x.needed_bandwidth_bytes_per_s) : json(nullptr)},
        {"needed_bandwidth_link", x.needed_on_nvlink ? "nvlink" : "scale_out"},
    };
  }
  return out;
}

}  // namespace hyla
