#include "hyla/train/gradient_reducer.h"

#include <algorithm>
#include <chrono>

#include "hyla/core/clock.h"
#include "hyla/core/error.h"
#include "hyla/model/expert_exchange.h"

namespace hyla {

GradientReducer::GradientReducer(ParamStore& params, Collective& collective, Collective* expert_replicas,
                                 bool shard_optimizer, double bucket_mb)
    : collective_(collective), expert_replicas_(expert_replicas), sharded_(shard_optimizer && collective.size() > 1) {
  const int64_t elements = params.numel(), n = collective.size();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t first = sharded_ ? elements * r / n : 0, end = sharded_ ? elements * (r + 1) / n : elements;
    shards_.push_back({first, end - first});
  }
  // Runs of the flat buffers that hold routed experts' gradients or none, in offset order.
  std::vector<Bucket> runs;
  for (const auto& p : params.params()) {
    if (!p->held || p->is_quantized()) continue;
    const bool experts = expert_replicas && routed_expert_of(p->name) >= 0;
    const int64_t offset = p->value.data<float>() - params.values();
    if (runs.empty() || runs.back().experts != experts) runs.push_back({{offset, 0}, experts});
    runs.back().range.count = offset + p->numel() - runs.back().range.first;
  }
  HYLA_ASSERT(!sharded_ || std::none_of(runs.begin(), runs.end(), [](const Bucket& b) { return b.experts; }));
  const int64_t bucket = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / 4));
  if (distributed())
    for (auto run = runs.rbegin(); run != runs.rend(); ++run)
      for (int64_t end = run->range.end(); end > run->range.first; end -= bucket) {
        const int64_t first = std::max(run->range.first, end - bucket);
        buckets_.push_back({{first, end - first}, run->experts});
      }
  counts_.resize(size_t(n));
  next_ = buckets_.size();
}

void GradientReducer::arm(float* grads, float* shard_grads) {
  grads_ = grads, shard_grads_ = shard_grads;
  next_ = 0;
}

void GradientReducer::gradients_final_from(int64_t offset) {
  while (next_ < buckets_.size() && buckets_[next_].range.first >= offset) start(buckets_[next_++]);
}

void GradientReducer::start(const Bucket& b) {
  const FlatRange bucket = b.range;
  if (b.experts) {
    if (expert_replicas_->size() == 1) return;  // each expert on one process: nothing to sum
    expert_replicas_->start_sum(std::span<float>(grads_ + bucket.first, size_t(bucket.count)));
    traffic_.expert_all_reduce_bytes += bucket.count * 4;
    return;
  }
  if (!sharded_) {
    collective_.start_sum(std::span<float>(grads_ + bucket.first, size_t(bucket.count)));
    traffic_.all_reduce_bytes += bucket.count * 4;
    return;
  }
  for (size_t r = 0; r < shards_.size(); ++r) {
    const int64_t first = std::max(bucket.first, shards_[r].first), end = std::min(bucket.end(), shards_[r].end());
    counts_[r] = int(std::max<int64_t>(0, end - first));
  }
  const FlatRange mine = shard();
  const int64_t into = std::clamp(bucket.first, mine.first, mine.end()) - mine.first;
  collective_.start_reduce_scatter(std::span<const float>(grads_ + bucket.first, size_t(bucket.count)), counts_,
                                   shard_grads_ + into);
  traffic_.reduce_scatter_bytes += bucket.count * 4;
}

void GradientReducer::finish() {
  if (!distributed()) return;
  HYLA_ASSERT(grads_ != nullptr);
  gradients_final_from(0);
  const auto t0 = std::chrono::steady_clock::now();
  collective_.wait();
  if (expert_replicas_) expert_replicas_->wait();
  traffic_.wait_seconds += seconds_since(t0);
}

void GradientReducer::gather(float* values) {
  if (!sharded_) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Bucket& b : buckets_) {
    const FlatRange bucket = b.range;
    for (size_t r = 0; r < shards_.size(); ++r) {
      const int64_t first = std::max(bucket.first, shards_[r].first), end = std::min(bucket.end(), shards_[r].end());
      counts_[r] = int(std::max<int64_t>(0, end - first));
    }
    collective_.all_gather(std::span<float>(values + bucket.first, size_t(bucket.count)), counts_);
    traffic_.all_gather_bytes += int64_t(counts_[size_t(collective_.rank())]) * 4;
  }
  traffic_.wait_seconds += seconds_since(t0);
}

}  // namespace hyla
