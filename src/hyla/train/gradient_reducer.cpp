#include "hyla/train/gradient_reducer.h"

#include <algorithm>
#include <chrono>

#include "hyla/core/clock.h"
#include "hyla/core/error.h"

namespace hyla {

GradientReducer::GradientReducer(int64_t elements, Collective& collective, bool shard_optimizer, double bucket_mb)
    : collective_(collective), sharded_(shard_optimizer && collective.size() > 1) {
  const int64_t n = collective.size();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t first = sharded_ ? elements * r / n : 0, end = sharded_ ? elements * (r + 1) / n : elements;
    shards_.push_back({first, end - first});
  }
  const int64_t bucket = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / 4));
  if (distributed())
    for (int64_t end = elements; end > 0; end -= bucket) buckets_.push_back({std::max<int64_t>(0, end - bucket), 0});
  for (size_t i = 0; i < buckets_.size(); ++i)
    buckets_[i].count = (i == 0 ? elements : buckets_[i - 1].first) - buckets_[i].first;
  counts_.resize(size_t(n));
  next_ = buckets_.size();
}

void GradientReducer::arm(float* grads, float* shard_grads) {
  grads_ = grads, shard_grads_ = shard_grads;
  next_ = 0;
}

void GradientReducer::gradients_final_from(int64_t offset) {
  while (next_ < buckets_.size() && buckets_[next_].first >= offset) start(buckets_[next_++]);
}

void GradientReducer::start(FlatRange bucket) {
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
  traffic_.wait_seconds += seconds_since(t0);
}

void GradientReducer::gather(float* values) {
  if (!sharded_) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (const FlatRange& bucket : buckets_) {
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
