#pragma once
// `hyla plan`: what a configuration costs to serve and to train on a given GPU, from the config
// alone. Every figure's formula is in docs/plan.md.
#include <cstdint>
#include <optional>

#include "hyla/model/config.h"
#include "hyla/model/param_count.h"
#include "hyla/plan/comm.h"
#include "hyla/plan/flops.h"
#include "hyla/plan/formats.h"
#include "hyla/plan/gpus.h"
#include "hyla/plan/hosts.h"
#include "hyla/plan/offload.h"
#include "hyla/plan/sequence_memory.h"

namespace hyla {

struct PlanOptions {
  int64_t context = 0;  // 0: the config's max_position_embeddings
  NumberFormat weights = parse_weight_format("bf16");
  NumberFormat kv = parse_cache_format("bf16");
  int64_t batch = 1;  // concurrent sequences
  GpuSpec gpu = parse_gpu("h200-141g");
  double mfu = 0.4;
  double train_tokens = 15e12;
  int64_t train_seq_len = 4096;
  // A fixed box (offload.h): with box_gpus > 0, the routed experts fill its GPUs' HBM after
  // everything else, then host RAM, NVMe and object storage, each read at its bandwidth.
  int64_t box_gpus = 0;
  double host_memory_bytes = 0;
  double host_bandwidth_bytes_per_s = 50e9;      // per GPU: PCIe 5.0 x16 (64 GB/s raw)
  double nvme_bytes = 0;
  double nvme_bandwidth_bytes_per_s = 28e9;      // every drive together: e.g. 4 x 7 GB/s
  double object_bandwidth_bytes_per_s = 1.25e9;  // a 10 Gb/s network
  // Set: the communication of training on a DP x EP layout against its compute (comm.h).
  std::optional<CommOptions> comm;
  // Set: inference over CPU servers, tensor- and expert-parallel (hosts.h).
  std::optional<HostsOptions> hosts;
};

// Each GPU keeps this share of its memory for weights and sequence state; the rest is held back
// for the runtime, communication buffers, activations and fragmentation.
constexpr double kUsableMemoryFraction = 0.9;

struct Deployment {
  double usable_bytes_per_gpu = 0;
  double needed_bytes = 0;  // weights + batch × sequence state
  int64_t min_gpus = 0;
};

// A decode rate read three ways. A step gives each of the batch's sequences one token, so one
// sequence sees 1 / step time; the deployment makes batch times that; per GPU is the deployment's
// rate over its GPUs (what one GPU contributes, not what one GPU alone would decode).
struct DecodeRate {
  double per_sequence = 0;
  double deployment = 0;  // all sequences of the batch together
  double per_gpu = 0;
};

// One decode step of the whole batch with routed experts spread over the deployment's GPUs
// (expert parallelism) and the other weights sharded over the same GPUs, every GPU reading and
// computing its 1/N share at the same time.
struct DecodeStep {
  int64_t batch = 1;
  int64_t gpus = 1;
  double experts_touched_per_layer = 0;  // distinct routed experts the batch's tokens select
  double dense_bytes = 0;                // non-routed weights, less the embedding lookup table
  double expert_bytes = 0;               // the touched experts' weights
  double cache_bytes = 0;                // latent caches read + KDA states read and written
  double bandwidth_seconds = 0;          // total bytes / (N · bandwidth)
  double compute_seconds = 0;            // batch · decode FLOPs per token / (N · peak)

  double total_bytes() const { return dense_bytes + expert_bytes + cache_bytes; }
  DecodeRate rate(double step_seconds) const;
  DecodeRate bandwidth_bound() const { return rate(bandwidth_seconds); }
  DecodeRate compute_bound() const { return rate(compute_seconds); }
  DecodeRate upper_bound() const;
};

// bf16 weights (2) + bf16 gradients (2) + f32 master weights (4) + f32 AdamW moments (8).
constexpr double kTrainingBytesPerParam = 16;

struct Training {
  double state_bytes = 0;
  int64_t zero3_gpus = 0;      // every byte sharded
  int64_t zero1_gpus = 0;      // optimizer sharded, bf16 weights + grads replicated; 0 if they do not fit one GPU
  TokenFlops flops_per_token;  // at train_seq_len
  // 6 × matmul parameters + 3 × forward attention: forward and backward of one token.
  double flops_per_trained_token = 0;
  double flops = 0;  // × train_tokens
  double gpu_hours = 0;
};

struct Plan {
  ModelConfig config;
  PlanOptions options;  // context resolved
  ParamCounts params;
  int64_t matmul_params = 0;
  double weight_bytes = 0;         // every parameter, all experts resident
  double active_weight_bytes = 0;  // the parameters one token uses
  SequenceMemory sequence;
  TokenFlops flops;  // at the context
  Deployment deployment;
  double prefill_flops = 0;    // a whole prompt of `context` tokens
  double prefill_seconds = 0;  // on the deployment's GPUs at the given MFU
  DecodeStep decode;
  Training training;
  std::optional<ExpertPlacement> experts;      // options.box_gpus > 0
  std::optional<Communication> communication;  // options.comm set
  std::optional<HostsPlan> hosts, one_host;    // options.hosts set: its hosts, and one such host alone
};

// Fails with a one-line hyla::Error on options outside their range.
Plan make_plan(const ModelConfig& config, const PlanOptions& options);

}  // namespace hyla
