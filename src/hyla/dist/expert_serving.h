#pragma once
// Inference across processes (`mpirun -np N hyla serve|generate|chat|bench --model DIR`): the
// routed experts are split over the N processes (expert_range in expert_parallel.h); rank 0 holds
// every other weight, runs the command (HTTP, scheduler, sampling) and routes; the others hold
// only their experts and compute their rows of each of rank 0's MoE layers. Before each MoE
// layer's exchange rank 0 broadcasts which layer and precision follow; when the command ends
// (stop_processes) it broadcasts "stop". The rows rank 0's own experts compute are the rows one process would compute, in the
// same blocks, so the outputs are one process's bit for bit.
#include <filesystem>
#include <memory>

#include "hyla/model/model.h"

namespace hyla {

// Rank 0 of a job of several processes: `dir` with rank 0's share of the experts, its MoE layers
// exchanging with the other processes. A lone process: Model::load.
std::unique_ptr<Model> load_model_across_processes(const std::filesystem::path& dir, const ModelLoadOptions& options);

// Every process of a command that serves a model calls this first. Any but rank 0: loads its
// experts of `dir`, computes their rows for rank 0 until rank 0's command ends, and returns true
// (the command then ends there). Rank 0 or a lone process: false.
// `options`: its decode_quantized (as rank 0's).
bool serve_experts_to_rank0(const std::filesystem::path& dir, const ModelLoadOptions& options = {});

}  // namespace hyla
