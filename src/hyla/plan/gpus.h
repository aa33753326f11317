#pragma once
// The accelerators `hyla plan` sizes deployments for: memory, HBM bandwidth and dense bf16
// throughput (sources in docs/plan.md), or a custom triple.
#include <string>
#include <vector>

namespace hyla {

struct GpuSpec {
  std::string name;
  double memory_bytes = 0;  // what the device exposes, in decimal bytes
  double bandwidth_bytes_per_s = 0;
  double bf16_flops = 0;  // dense (no 2:4 sparsity) tensor-core peak
};

// A name from the table (a100-80g, h100-80g, h200-141g, b200-192g) or `custom:MEM_GB,BW_TBps,TFLOPS`;
// anything else is a one-line hyla::Error.
GpuSpec parse_gpu(const std::string& text);
const std::vector<GpuSpec>& known_gpus();

}  // namespace hyla
