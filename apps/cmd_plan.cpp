#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "commands.h"
#include "hyla/model/model_files.h"
#include "hyla/core/error.h"
#include "hyla/model/config.h"
#include "hyla/plan/plan.h"
#include "hyla/plan/plan_report.h"

namespace hyla::cli {

void add_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "What a configuration costs to serve and to train (formulas: docs/plan.md)");
  static std::string config_path, weights = "bf16", kv = "bf16", gpu = "h200-141g";
  static PlanOptions options;
  static bool as_json = false;
  cmd->add_option("--config", config_path,
                  "Model config.json (hyla's or a Hugging Face one), model directory, or GGUF file")
      ->required();
  cmd->add_option("--context", options.context, "Tokens per sequence (default: max_position_embeddings)");
  cmd->add_option("--weights", weights, "Weight format: bf16, fp8, int8, int4, q8_0, mxfp4")->capture_default_str();
  cmd->add_option("--kv", kv, "Latent cache format: bf16, fp8")->capture_default_str();
  cmd->add_option("--batch", options.batch, "Concurrent sequences")->capture_default_str();
  cmd->add_option("--gpu", gpu, "h100-80g, h200-141g, a100-80g, b200-192g or custom:MEM_GB,BW_TBps,TFLOPS")
      ->capture_default_str();
  cmd->add_option("--mfu", options.mfu, "Model FLOPs utilisation for prefill and training")->capture_default_str();
  cmd->add_option("--train-tokens", options.train_tokens, "Training tokens")->capture_default_str();
  cmd->add_option("--train-seq-len", options.train_seq_len, "Training sequence length")->capture_default_str();
  static double host_gb = 0, host_gbps = 50, nvme_gb = 0, nvme_gbps = 28, object_gbps = 1.25;
  cmd->add_option("--gpus", options.box_gpus, "GPUs in the box: plan where the routed experts live (0: as many as hold everything)")
      ->capture_default_str();
  auto* host_memory = cmd->add_option("--host-memory", host_gb,
                                      "With --gpus: host RAM for experts, GB; with --hosts: each server's RAM, GB")
                          ->capture_default_str();
  auto* host_bandwidth = cmd->add_option("--host-bandwidth", host_gbps,
                                         "With --gpus: host-to-GPU bandwidth per GPU, GB/s; with --hosts: each "
                                         "server's memory bandwidth, GB/s")
                             ->capture_default_str();
  cmd->add_option("--nvme", nvme_gb, "With --gpus: NVMe space for experts, GB")->capture_default_str();
  cmd->add_option("--nvme-bandwidth", nvme_gbps,
                  "With --gpus: NVMe read bandwidth, all drives, GB/s; with --hosts: each server's, for experts its "
                  "RAM cannot hold")
      ->capture_default_str();
  // Inference across CPU servers, tensor- and expert-parallel (docs/distributed.md).
  static int64_t hosts = 0;
  static std::string network, expert_weights = "mxfp4";
  static double host_tflops = 2;
  auto* hosts_option = cmd->add_option("--hosts", hosts,
                                       "CPU servers the model is split over (tensor-parallel dense half, "
                                       "expert-parallel routed experts); weights: --weights for the dense half");
  auto* network_option = cmd->add_option("--network", network, "With --hosts: each server's link, GBPS,LATENCY_US");
  cmd->add_option("--host-flops", host_tflops, "With --hosts: each server's bf16 matmul rate, TFLOP/s")
      ->capture_default_str();
  cmd->add_option("--expert-weights", expert_weights, "With --hosts: the routed experts' format")->capture_default_str();
  cmd->add_option("--object-bandwidth", object_gbps, "With --gpus: object storage read bandwidth, GB/s")->capture_default_str();
  // Any of these plans the communication of training on the DP x EP layout (docs/plan.md
  // "Communication of training").
  static CommOptions comm;
  static std::string fabric = "ib-ndr400", nvlink = "nvlink4";
  const std::vector<CLI::Option*> comm_options = {
      cmd->add_option("--dp", comm.dp, "Training: expert replicas, each a group of --ep GPUs")->capture_default_str(),
      cmd->add_option("--ep", comm.ep, "Training: GPUs the routed experts are spread over (divides the expert count)")
          ->capture_default_str(),
      cmd->add_option("--fabric", fabric,
                      "Training: scale-out link per GPU: nvlink4, nvlink5, ib-ndr400, ib-hdr200, roce-400 or "
                      "custom:GBps[,latency_us]")
          ->capture_default_str(),
      cmd->add_option("--nvlink", nvlink, "Training: link inside an NVLink domain (same choices as --fabric)")
          ->capture_default_str(),
      cmd->add_option("--nvlink-domain", comm.nvlink_domain, "Training: GPUs per NVLink domain (8: HGX, 72: NVL72)")
          ->capture_default_str(),
      cmd->add_option("--batch-tokens", comm.batch_tokens, "Training: tokens per optimiser step, all GPUs together")
          ->default_str("16777216"),
      cmd->add_option("--comm-target", comm.target_share,
                      "Training: share of the step communication may take, for the bandwidth it needs")
          ->capture_default_str(),
  };
  cmd->add_flag("--json", as_json, "Print one JSON object");
  cmd->callback([comm_options, hosts_option, network_option, host_memory, host_bandwidth] {
    const ModelConfig config = model_config_of(config_path);
    options.weights = parse_weight_format(weights);
    options.kv = parse_cache_format(kv);
    options.gpu = parse_gpu(gpu);
    options.host_memory_bytes = host_gb * 1e9, options.host_bandwidth_bytes_per_s = host_gbps * 1e9;
    options.nvme_bytes = nvme_gb * 1e9, options.nvme_bandwidth_bytes_per_s = nvme_gbps * 1e9;
    options.object_bandwidth_bytes_per_s = object_gbps * 1e9;
    if (std::any_of(comm_options.begin(), comm_options.end(), [](const CLI::Option* flag) { return flag->count() > 0; })) {
      comm.scale_out = parse_fabric(fabric, "--fabric");
      comm.nvlink = parse_fabric(nvlink, "--nvlink");
      options.comm = comm;
    }
    if (hosts_option->count() > 0) {
      HYLA_CHECK(network_option->count() > 0 && host_memory->count() > 0 && host_bandwidth->count() > 0,
                 "--hosts needs --network GBPS,LATENCY_US, --host-memory GB and --host-bandwidth GB/s");
      HostsOptions h;
      h.hosts = hosts;
      h.network = parse_network(network, "--network");
      h.memory_bytes = host_gb * 1e9;
      h.bandwidth_bytes_per_s = host_gbps * 1e9;
      h.flops = host_tflops * 1e12;
      h.disk_bandwidth_bytes_per_s = nvme_gbps * 1e9;
      h.dense_weights = options.weights;
      h.expert_weights = parse_weight_format(expert_weights, "--expert-weights");
      options.hosts = h;
    }
    const Plan plan = make_plan(config, options);
    if (as_json)
      fmt::print("{}\n", plan_json(plan).dump(2));
    else
      fmt::print("{}", plan_text(plan));
  });
}

}  // namespace hyla::cli
