#pragma once
// Serving a model whose routed experts do not fit in memory (docs/offload.md). The routed experts'
// int8 or MXFP4 weights stay in the model's files, memory-mapped (the page cache keeps what the OS can), and
// every MoE layer keeps a resident cache of packed experts in a fixed number of slots; everything
// else of the model is loaded as usual. Before a layer's expert compute, the experts its tokens
// chose are made resident: a hit uses its slot; a miss packs the expert from the mapped file into
// the slot of the expert the policy evicts. While layer l computes, an I/O thread prefetches what
// layer l+1's router picks from layer l's FFN input (the prediction of the next layer's routing).
//
// What crosses the seam (MoeFfn ↔ ExpertOffload): the layer's dispatch (which experts have
// slots) and its FFN input rows (for the next layer's prediction) go in; the packed weights of
// the experts being computed come out (PackedExpertWeights, valid until the compute returns). The
// dispatch, routing, combine and results never change: an offloaded model computes the very
// logits of the resident one.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hyla/core/tensor.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/moe_dispatch.h"
#include "hyla/model/moe_experts.h"

namespace hyla {

class Router;
class MoeFfn;

// Which resident expert a miss evicts.
enum class ExpertCachePolicy : uint8_t {
  Lru,        // the least recently used
  Frequency,  // the least used, by a use count halved every `experts` uses of the layer (ties: LRU)
};
ExpertCachePolicy parse_expert_cache_policy(const std::string& text);  // "lru" | "frequency"
const char* expert_cache_policy_name(ExpertCachePolicy policy);

// --expert-memory: bytes with an optional unit (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB; all
// binary) or a percentage of the model's routed-expert bytes ("25%").
struct ExpertMemory {
  int64_t bytes = -1;     // >= 0 when given in bytes
  double fraction = -1;   // in (0, 1] when given as a percentage
  int64_t resolve(int64_t expert_bytes) const;
};
ExpertMemory parse_expert_memory(const std::string& text);

struct ExpertOffloadOptions {
  ExpertMemory memory;
  ExpertCachePolicy policy = ExpertCachePolicy::Lru;
  bool prefetch = true;
};

// Counters of one MoE layer since the start (or the last reset).
struct ExpertLayerStats {
  int64_t requests = 0;          // experts a forward needed (each distinct expert once per forward)
  int64_t hits = 0;              // of those, resident or already being prefetched
  int64_t predicted = 0;         // experts the previous layer's prediction named
  int64_t predicted_used = 0;    // of those, needed by the forward they were predicted for
  int64_t predicted_needed = 0;  // experts needed by forwards that had a prediction
  int64_t fetches = 0, fetched_bytes = 0;   // experts packed from the files (misses and prefetches)
  double stall_seconds = 0;      // compute waiting for a fetch (its own or an in-flight prefetch)
  std::vector<int64_t> routed;   // [E] token rows routed to each expert (how skewed the routing is)
  double hit_rate() const { return requests ? double(hits) / double(requests) : 0; }
  double precision() const { return predicted ? double(predicted_used) / double(predicted) : 0; }
  double recall() const { return predicted_needed ? double(predicted_used) / double(predicted_needed) : 0; }
  // The share of the routed rows that the most-routed `fraction` of the experts took (0.2 of a
  // uniform routing: 0.2).
  double top_share(double fraction) const;
};

struct ExpertOffloadStats {
  std::vector<ExpertLayerStats> layers;  // MoE layers in depth order
  int64_t tokens = 0;                    // token rows through the model
  int64_t slots_per_layer = 0, experts_per_layer = 0, expert_bytes = 0;
  ExpertLayerStats total() const;
  double mean_top_share(double fraction) const;  // ExpertLayerStats::top_share, averaged over the layers
  double bytes_per_token() const;
  double stall_seconds_per_token() const;
};

class ExpertOffload {
 public:
  // `layers`: the model's MoE layers in depth order, whose routed experts are int8 or MXFP4 (all
  // alike) in the files of
  // `weights` (a model loaded without them: ParamStore::hold_only). Fails, naming the figure, when
  // the memory cannot hold each layer's num_experts_per_tok experts.
  ExpertOffload(std::vector<MoeFfn*> layers, std::shared_ptr<const ModelWeights> weights,
                const ExpertOffloadOptions& options, const std::string& source);
  ~ExpertOffload();
  ExpertOffload(const ExpertOffload&) = delete;
  ExpertOffload& operator=(const ExpertOffload&) = delete;

  // The weights of layer `layer`'s experts [first, last) with load > 0, in groups of at most
  // slots_per_layer(): `compute(group_first, group_last, weights)` for each group, `weights`
  // indexed by expert id and valid for the group's experts during the call.
  using Compute = std::function<void(int64_t first, int64_t last, std::span<const PackedExpertWeights> weights)>;
  void run(int layer, const ExpertDispatch& dispatch, int64_t first, int64_t last, const Compute& compute);
  // From layer `layer`'s FFN input u [n, d] (before its experts run): queues the prefetch of the
  // experts the next MoE layer's router picks from u.
  void predict_next(int layer, const float* u, int64_t n, Arena& scratch);
  // Counts `rows` token rows through the model (once per forward).
  void count_tokens(int64_t rows);

  ExpertOffloadStats stats() const;
  void reset_stats();
  // One line: slots, memory, policy and prefetch; summary() adds the counters so far.
  std::string describe_memory() const;
  std::string summary() const;
  // Empties every slot and drops the experts' file pages from the page cache (a cold start).
  void evict_all(bool drop_page_cache);

  int64_t slots_per_layer() const { return slots_; }
  int64_t expert_bytes() const { return expert_bytes_; }
  int64_t resident_bytes() const { return int64_t(layers_.size()) * slots_ * expert_bytes_; }
  const ExpertOffloadOptions& options() const { return options_; }

 private:
  // One matrix in the files, read when it is checked or packed (a view of mapped safetensors; a
  // GGUF tensor's codes, converted): int8 values [rows, cols] and scales [rows, cols / block],
  // MXFP4 codes [rows, cols / 2] and scales [rows, cols / 32], or a GGUF's blocks of another
  // quantised type, which are used where they lie (no scale tensor, no packing).
  struct Source {
    std::string name, scale;
    int64_t rows = 0, cols = 0, block = 0;  // block 0: MXFP4
    std::optional<GgmlType> ggml;           // ggml blocks of this type
  };
  struct Layer;
  struct PrefetchRequest {
    bool pending = false;
    int layer = 0;
    int64_t forward = 0;
    std::vector<int32_t> experts;
  };

  // Fails naming the tensor unless expert e's scales in the files are valid (int8: finite and
  // >= 0; MXFP4: not NaN).
  void check_scales(const Layer& layer, int64_t e) const;
  // Starts the reads of expert e's bytes (MapAdvice::WillNeed), so that a layer's misses or a
  // prediction are read together rather than fault by fault.
  void will_need(const Layer& layer, int64_t e) const;
  // Packs expert e from the files into the layer's `slot` and points its weights there; fails as
  // check_scales does (the slot's contents are then undefined). ggml blocks: points its weights at
  // the blocks in the map, whose check reads them in (a page-in, not a copy).
  void pack(Layer& layer, int64_t e, int64_t slot);
  // Under the layer's lock, when expert e leaves its slot: ggml blocks leave the resident set
  // (the slots of packed experts are simply overwritten).
  void evict(const Layer& layer, int64_t e) const;
  // Under the layer's lock: the slot whose expert the policy replaces now (-1: none may be).
  int64_t victim(Layer& layer) const;
  void prefetch_loop();

  ExpertOffloadOptions options_;
  std::shared_ptr<const ModelWeights> weights_;
  std::vector<std::unique_ptr<Layer>> layers_;
  int64_t experts_ = 0, k_ = 0, slots_ = 0, expert_bytes_ = 0;
  int64_t gate_bytes_ = 0, down_bytes_ = 0;
  bool ggml_ = false;  // the experts are ggml blocks in the map: the slots are pages of it, not copies
  Tensor slot_memory_;
  std::atomic<int64_t> tokens_{0}, forward_{0};

  std::mutex queue_mutex_;
  std::condition_variable queue_wake_;
  std::vector<PrefetchRequest> queue_;  // one request per layer (the newest wins)
  bool stopping_ = false;
  std::thread io_thread_;
};

}  // namespace hyla
