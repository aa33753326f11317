#include "hyla/plan/offload.h"

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/plan/plan.h"
#include "hyla/plan/units.h"

namespace hyla {

double ExpertPlacement::step_seconds(double hit_rate) const {
  return std::max(resident_step_seconds, (1 - hit_rate) * miss_seconds);
}

double ExpertPlacement::hit_rate_for_resident_speed() const {
  return miss_seconds > 0 ? std::clamp(1 - resident_step_seconds / miss_seconds, 0.0, 1.0) : 0.0;
}

ExpertPlacement plan_expert_placement(const Plan& p) {
  const PlanOptions& o = p.options;
  const double N = double(o.box_gpus);
  const double b_w = o.weights.bytes_per_value;
  ExpertPlacement x;
  x.gpus = o.box_gpus;
  x.expert_bytes = double(p.params.total[int(Component::RoutedExperts)]) * b_w;
  x.touched_bytes = p.decode.expert_bytes;
  const double resident = p.weight_bytes - x.expert_bytes + double(o.batch) * p.sequence.total_bytes();
  const double hbm = N * kUsableMemoryFraction * o.gpu.memory_bytes;
  HYLA_CHECK(resident <= hbm,
             "--gpus {}: the weights other than the routed experts and the state of {} sequence(s) need {}, more than "
             "the {} the GPUs offer (90% of their memory)",
             o.box_gpus, o.batch, si(resident, "B"), si(hbm, "B"));
  const double tier_capacity[4] = {hbm - resident, o.host_memory_bytes, o.nvme_bytes, x.expert_bytes};
  const double tier_bandwidth[4] = {N * o.gpu.bandwidth_bytes_per_s, N * o.host_bandwidth_bytes_per_s,
                                    o.nvme_bandwidth_bytes_per_s, o.object_bandwidth_bytes_per_s};
  const char* names[4] = {"GPU HBM", "host RAM", "NVMe", "object storage"};
  double left = x.expert_bytes;
  for (int t = 0; t < 4; ++t) {
    MemoryTier tier{names[t], tier_capacity[t], tier_bandwidth[t], std::min(left, tier_capacity[t]), 0};
    tier.share = x.expert_bytes > 0 ? tier.expert_bytes / x.expert_bytes : 0;
    left -= tier.expert_bytes;
    x.tiers.push_back(tier);
  }
  // The box's own bound: what p.decode computes for min_gpus, for N GPUs reading at once.
  x.resident_step_seconds = std::max(p.decode.total_bytes() / (N * o.gpu.bandwidth_bytes_per_s),
                                     double(o.batch) * p.flops.decode() / (N * o.gpu.bf16_flops));
  const double below = 1 - x.tiers[0].share;
  if (below > 0)
    for (int t = 1; t < 4; ++t)
      if (x.tiers[size_t(t)].share > 0)
        x.miss_seconds += x.touched_bytes * x.tiers[size_t(t)].share / below / x.tiers[size_t(t)].bandwidth_bytes_per_s;
  return x;
}

}  // namespace hyla
