#pragma once
// `hyla plan --hosts N`: inference over N CPU servers, the dense half split by tensor parallelism
// and the routed experts by expert parallelism (issue 68). What each host holds, what a token
// sends, and the decode and prefill rates that follow, from the config and four numbers per host
// (formulas and the layout behind them: docs/distributed.md "Across servers: the model of it").
#include <cstdint>
#include <string>

#include "hyla/plan/formats.h"

namespace hyla {

struct Plan;

// One host's network link: bandwidth in one direction and the latency of one message.
struct Network {
  double bandwidth_bytes_per_s = 0;
  double latency_seconds = 0;
};
// "GBPS,LATENCY_US" (e.g. "12.5,5" for 100 Gb/s Ethernet with RDMA); anything else is a one-line
// hyla::Error naming `option`.
Network parse_network(const std::string& text, const std::string& option);

struct HostsOptions {
  int64_t hosts = 1;
  Network network;
  double memory_bytes = 0;              // each host's RAM
  double bandwidth_bytes_per_s = 0;     // each host's memory bandwidth
  double flops = 2e12;                  // each host's sustained bf16 matmul rate
  double disk_bandwidth_bytes_per_s = 0;  // each host's reads of experts that do not fit its RAM
  NumberFormat dense_weights = parse_weight_format("q8_0");
  NumberFormat expert_weights = parse_weight_format("mxfp4");
  int64_t prefill_chunk = 512;          // tokens a prompt's collectives are batched over
};

// A host holds this share of its RAM for weights and state; the rest is the system's, the page
// cache's and the activations'.
constexpr double kHostUsableFraction = 0.9;

struct HostsPlan {
  int64_t hosts = 1;
  // Held by each host.
  double dense_bytes = 0;    // 1/N of every parameter but the routed experts
  double expert_bytes = 0;   // 1/N of every layer's routed experts
  double state_bytes = 0;    // the batch's sequence state: KDA states 1/N, latent caches whole
  double held_bytes() const { return dense_bytes + expert_bytes + state_bytes; }
  double resident_expert_share = 1;  // of its experts that fit its RAM beside the rest (1: all)
  bool fits_dense = true;            // the dense share and the state fit without the experts

  // One decode step (batch sequences, one token each), on the busiest host.
  int64_t collectives_per_token = 0;  // all-reduces, all-gathers and the logits' gather
  double sent_bytes_per_token = 0;    // each host's share of every collective, one token
  double experts_read_per_layer = 0;  // routed experts the busiest host reads in an MoE layer
  double read_bytes = 0;              // weights and state the busiest host reads in a step
  double memory_seconds = 0, compute_seconds = 0, disk_seconds = 0, network_seconds = 0;
  double step_seconds() const;        // max(memory, compute) + disk + network
  double decode_tokens_per_s_per_sequence() const { return 1 / step_seconds(); }

  // Prefill: per prompt token, the collectives' latency shared by a chunk.
  double prefill_compute_seconds_per_token = 0, prefill_network_seconds_per_token = 0;
  double prefill_tokens_per_s() const {
    return 1 / (prefill_compute_seconds_per_token + prefill_network_seconds_per_token);
  }
};

// The expected largest number of a token's k routed experts (k of E, without repeats) that one of
// N hosts holds, each host holding E/N: the step waits for the host that reads the most.
double expected_busiest_host_experts(int64_t experts, int64_t chosen, int64_t hosts);

HostsPlan plan_hosts(const Plan& plan, const HostsOptions& options);

}  // namespace hyla
