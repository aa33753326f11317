#pragma once
// `hyla plan --gpus N`: where a fixed box keeps the routed experts when they do not all fit its
// GPUs, and the decode speed the tiers allow (docs/plan.md "Expert offload"). Experts fill HBM
// after the non-expert weights and sequence state, then host RAM, then NVMe, then object storage;
// a decode step reads the experts its tokens touch, the hits from HBM and the misses over the
// tier that holds them.
#include <string>
#include <vector>

namespace hyla {

struct Plan;

struct MemoryTier {
  std::string name;
  double capacity_bytes = 0;         // what the tier offers the experts
  double bandwidth_bytes_per_s = 0;  // into the GPUs, all of them together
  double expert_bytes = 0;           // the experts it holds
  double share = 0;                  // of all expert bytes
};

struct ExpertPlacement {
  int64_t gpus = 0;
  double expert_bytes = 0;         // every routed expert at the weight format
  double touched_bytes = 0;        // the experts one decode step reads (batch-dependent)
  std::vector<MemoryTier> tiers;   // HBM, host RAM, NVMe, object storage
  double resident_step_seconds = 0;  // every touched expert in HBM: the bandwidth/compute bound of the box
  double miss_seconds = 0;           // a step's touched experts all fetched from the lower tiers (hit rate 0)

  // Misses (1 - hit_rate) · touched_bytes come from the lower tiers in proportion to what they
  // hold, one tier after the other; fetches overlap compute (prefetch), so a step takes the longer
  // of the two.
  double step_seconds(double hit_rate) const;
  // LRU over routing that is uniform across experts hits as often as the HBM tier's share.
  double uniform_hit_rate() const { return tiers.empty() ? 1 : tiers[0].share; }
  // The hit rate at which fetching takes no longer than the resident step.
  double hit_rate_for_resident_speed() const;
};

// Defined when options.box_gpus > 0; fails when the non-expert weights and the batch's state do
// not fit the box's GPUs.
ExpertPlacement plan_expert_placement(const Plan& plan);

}  // namespace hyla
