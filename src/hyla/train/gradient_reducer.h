#pragma once
// Data-parallel gradient reduction, overlapped with the backward pass. The flat gradient buffer
// (ParamStore::grads) is cut into buckets from its end, because the backward finishes the last
// layers' gradients first; during a step's last micro-batch the model reports how far its
// gradients are final (Model::set_gradient_hook) and each bucket wholly past that point starts at
// once, on the collective's own thread, while the backward goes on. Without sharding a bucket is
// all-reduced in place. With ZeRO-1 (`shard_optimizer`) the buffer is split into one contiguous
// shard per process, a bucket is reduce-scattered into the shards' gradients, the optimiser
// updates only this process's shard (optimizer.h), and gather() then all-gathers every shard's new
// weights. Under expert parallelism a process holds only its routed experts (ParamStore::hold_only),
// whose gradients are summed only over `expert_replicas` (the processes holding the same experts),
// every other gradient over all processes; buckets never mix the two. Nothing but gradient and
// weight buffers crosses.
//
// Traffic is counted as the bytes each operation is handed on this process (what it sends in):
// per step P·4 bytes of all-reduce, or P·4 of reduce-scatter plus P·4/N of all-gather, for P
// parameters over N processes (docs/distributed.md has the wire volume of each).
#include <cstdint>
#include <vector>

#include "hyla/model/collective.h"
#include "hyla/model/params.h"

namespace hyla {

struct ReductionTraffic {
  int64_t all_reduce_bytes = 0, reduce_scatter_bytes = 0, all_gather_bytes = 0;
  int64_t expert_all_reduce_bytes = 0;  // routed experts' gradients, over their replicas
  double wait_seconds = 0;  // the caller's time blocked in finish() and gather()
};

class GradientReducer {
 public:
  // Over `params`' flat buffers. `expert_replicas` (null without expert parallelism) reduces the
  // routed experts' gradients; sharding needs every parameter held (no expert parallelism).
  GradientReducer(ParamStore& params, Collective& collective, Collective* expert_replicas, bool shard_optimizer,
                  double bucket_mb);
  Collective& collective() const { return collective_; }
  bool distributed() const { return collective_.size() > 1; }
  bool sharded() const { return sharded_; }
  // This process's optimiser shard of the flat buffers: all of them unless sharded.
  FlatRange shard() const { return shards_[size_t(collective_.rank())]; }
  // Before the step's last micro-batch: `grads` is the flat gradient buffer, `shard_grads` the
  // shard's reduced gradient (sharded; unsharded it is grads itself, reduced in place).
  void arm(float* grads, float* shard_grads);
  // Every gradient at flat offsets >= `offset` is final for this step.
  void gradients_final_from(int64_t offset);
  // Starts what is left and waits for every bucket.
  void finish();
  // Sharded: every shard's updated weights to every process.
  void gather(float* values);
  const ReductionTraffic& traffic() const { return traffic_; }

 private:
  struct Bucket {
    FlatRange range;
    bool experts;  // routed experts' gradients
  };
  void start(const Bucket& bucket);

  Collective& collective_;
  Collective* expert_replicas_;
  bool sharded_;
  std::vector<FlatRange> shards_;   // per rank
  std::vector<Bucket> buckets_;     // from the end of the buffer down
  std::vector<int> counts_;         // scratch: a bucket's part in each shard
  size_t next_ = 0;                 // the next bucket to start; buckets_.size() when disarmed
  float* grads_ = nullptr;
  float* shard_grads_ = nullptr;
  ReductionTraffic traffic_;
};

}  // namespace hyla
