#include "hyla/model/expert_offload.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <numeric>

#include "hyla/core/arith.h"
#include "hyla/core/byte_size.h"
#include "hyla/core/clock.h"
#include "hyla/core/error.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/model/ffn.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/mxfp4_weights.h"
#include "hyla/model/router.h"

namespace hyla {
namespace {

// Decode batches predict the next layer; a prefill's tokens choose most experts between them, so
// its prediction would only churn the cache.
constexpr int64_t kMaxPredictedRows = 16;


}  // namespace

ExpertCachePolicy parse_expert_cache_policy(const std::string& text) {
  if (text == "lru") return ExpertCachePolicy::Lru;
  if (text == "frequency") return ExpertCachePolicy::Frequency;
  throw Error(fmt::format("expert cache policy '{}' is not one of lru, frequency", text));
}

const char* expert_cache_policy_name(ExpertCachePolicy policy) {
  return policy == ExpertCachePolicy::Lru ? "lru" : "frequency";
}

ExpertMemory parse_expert_memory(const std::string& text) {
  ExpertMemory memory;
  if (text.ends_with('%')) {
    double value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size() - 1, value);
    if (ec == std::errc() && end == text.data() + text.size() - 1) {
      if (!(value > 0 && value <= 100))
        throw Error(fmt::format("--expert-memory '{}': a percentage of the experts is in (0, 100]", text));
      memory.fraction = value / 100;
      return memory;
    }
  } else if (const auto bytes = parse_byte_size(text)) {
    memory.bytes = *bytes;
    return memory;
  }
  throw Error(fmt::format("--expert-memory '{}' is neither a size (e.g. 512M, 2GiB, 1000000) nor a percentage of "
                          "the experts (e.g. 25%)",
                          text));
}

int64_t ExpertMemory::resolve(int64_t expert_bytes) const {
  return fraction > 0 ? int64_t(std::floor(fraction * double(expert_bytes))) : bytes;
}

ExpertLayerStats ExpertOffloadStats::total() const {
  ExpertLayerStats t;
  for (const ExpertLayerStats& l : layers) {
    t.requests += l.requests, t.hits += l.hits, t.predicted += l.predicted, t.predicted_used += l.predicted_used;
    t.predicted_needed += l.predicted_needed, t.fetches += l.fetches, t.fetched_bytes += l.fetched_bytes;
    t.stall_seconds += l.stall_seconds;
    t.routed.resize(std::max(t.routed.size(), l.routed.size()));
    for (size_t e = 0; e < l.routed.size(); ++e) t.routed[e] += l.routed[e];
  }
  return t;
}

double ExpertLayerStats::top_share(double fraction) const {
  std::vector<int64_t> sorted = routed;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const size_t top = size_t(std::llround(fraction * double(sorted.size())));
  const double all = double(std::accumulate(sorted.begin(), sorted.end(), int64_t(0)));
  return all > 0 ? double(std::accumulate(sorted.begin(), sorted.begin() + ptrdiff_t(top), int64_t(0))) / all : 0;
}

double ExpertOffloadStats::mean_top_share(double fraction) const {
  double sum = 0;
  for (const ExpertLayerStats& l : layers) sum += l.top_share(fraction);
  return layers.empty() ? 0 : sum / double(layers.size());
}

double ExpertOffloadStats::bytes_per_token() const {
  return tokens ? double(total().fetched_bytes) / double(tokens) : 0;
}

double ExpertOffloadStats::stall_seconds_per_token() const {
  return tokens ? total().stall_seconds / double(tokens) : 0;
}

// One MoE layer's cache. The slot arrays, the expert→slot map, the use counts, the prediction
// and the counters are guarded by `mutex`; `weights` entries are written by whoever fetches an
// expert and read by the compute only while the expert's slot is pinned and loaded.
struct ExpertOffload::Layer {
  int64_t index = 0;  // among the MoE layers
  const Router* router = nullptr;
  std::vector<std::array<Source, 3>> sources;  // [E] gate, up, down in the files
  std::vector<PackedExpertWeights> weights;    // [E] the resident experts' packed weights

  std::vector<int32_t> slot_expert;        // [slots] the expert in the slot, -1: empty
  std::vector<uint8_t> slot_loading;       // being packed (by a miss or a prefetch)
  std::vector<uint8_t> slot_prefetched;    // prefetched for a forward that has not reached this layer yet
  std::vector<int32_t> slot_pins;          // groups computing with it
  std::vector<int64_t> slot_used;          // tick of the last use (LRU)
  std::vector<int32_t> expert_slot;        // [E] its slot, -1: not resident
  std::vector<int64_t> uses;               // [E] use counts, halved every E uses (Frequency)
  int64_t tick = 0, uses_since_halving = 0;

  std::vector<uint8_t> predicted;          // [E] the prediction for forward `predicted_forward`
  int64_t predicted_forward = -1, reached_forward = -1;
  ExpertLayerStats stats;

  std::vector<int32_t> needed, group, missing, missing_slots, picks;  // the compute thread's scratch
  std::vector<std::atomic<bool>> checked;  // [E] ggml blocks: the expert's scales were found finite once
  std::mutex mutex;
  std::condition_variable loaded;
};

ExpertOffload::ExpertOffload(std::vector<MoeFfn*> layers, std::shared_ptr<const ModelWeights> weights,
                             const ExpertOffloadOptions& options, const std::string& source)
    : options_(options), weights_(std::move(weights)) {
  HYLA_CHECK(!layers.empty(), "{}: --expert-memory needs a model with MoE layers", source);
  const RoutedExperts& first = layers[0]->routed_experts();
  experts_ = first.experts();
  k_ = layers[0]->router().k();
  const int64_t in = first.in(), width = first.width();
  int64_t block = -1;  // the experts' int8 block, 0 for MXFP4, -2 for ggml blocks
  int64_t ggml_expert_bytes = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto layer = std::make_unique<Layer>();
    layer->index = int64_t(l);
    layer->router = &layers[l]->router();
    layer->sources.resize(size_t(experts_));
    for (int64_t e = 0; e < experts_; ++e) {
      const GatedMlp& mlp = layers[l]->routed_experts().expert(e);
      int64_t expert_bytes = 0;  // ggml blocks: the expert's bytes in the file
      const Linear* parts[3] = {&mlp.gate_proj, &mlp.up_proj, &mlp.down_proj};
      for (int m = 0; m < 3; ++m) {
        const Param& p = parts[m]->param();
        HYLA_CHECK(p.is_quantized(),
                   "{}: --expert-memory reads int8, MXFP4 or GGUF-quantised experts from the model's files, but '{}' "
                   "is {}; quantize the model first (hyla quantize --model DIR --out DIR [--experts mxfp4])",
                   source, p.name, dtype_name(weights_->entry(p.name).dtype));
        const int64_t kind = p.is_ggml() ? -2 : p.int8_block;
        const auto kind_name = [&] {
          return p.is_ggml() ? "ggml blocks" : p.is_mxfp4() ? "MXFP4" : fmt::format("int8 with block {}", p.int8_block);
        };
        HYLA_CHECK(block == -1 || block == kind,
                   "{}: --expert-memory needs every routed expert stored alike, but '{}' is {} and an earlier one is not",
                   source, p.name, kind_name());
        HYLA_ASSERT(!p.held);
        block = kind;
        Source& s = layer->sources[size_t(e)][size_t(m)];
        s = {p.name, "", p.shape[0], p.shape[1], p.int8_block, std::nullopt};
        if (p.is_ggml()) s.ggml = p.ggml.type, expert_bytes += int64_t(p.ggml.row_bytes()) * p.shape[0];
        else s.scale = p.is_mxfp4() ? mxfp4_scale_name(p.name) : int8_scale_name(p.name);
        // Read only when fetched, and then whole (will_need): the kernel's read-around on a fault
        // would read neighbouring experts that are not wanted.
        weights_->advise(p.name, MapAdvice::Random);
        if (!s.ggml) weights_->advise(s.scale, MapAdvice::Random);
      }
      ggml_expert_bytes = std::max(ggml_expert_bytes, expert_bytes);
    }
    layers_.push_back(std::move(layer));
  }
  const auto packed_bytes = [&](int64_t rows, int64_t cols) {
    return round_up(block > 0 ? int8_packed_bytes(rows, cols, block) : mxfp4_packed_bytes(rows, cols), 64);
  };
  ggml_ = block == -2;
  if (ggml_) {  // the budget counts the largest expert's pages; nothing is packed
    expert_bytes_ = ggml_expert_bytes;
  } else {
    gate_bytes_ = packed_bytes(width, in);
    down_bytes_ = packed_bytes(in, width);
    expert_bytes_ = 2 * gate_bytes_ + down_bytes_;
  }
  const int64_t total = expert_bytes_ * experts_ * int64_t(layers_.size());
  const int64_t budget = options_.memory.resolve(total);
  slots_ = std::min(experts_, budget / (expert_bytes_ * int64_t(layers_.size())));
  HYLA_CHECK(slots_ >= k_,
             "--expert-memory {} MiB holds {} expert(s) per MoE layer, but each token needs {}: give at least {} MiB "
             "({} bytes: {} layers x {} experts x {} bytes)",
             budget >> 20, slots_, k_, (k_ * expert_bytes_ * int64_t(layers_.size()) + (1 << 20) - 1) >> 20,
             k_ * expert_bytes_ * int64_t(layers_.size()), layers_.size(), k_, expert_bytes_);
  slot_memory_ = Tensor::empty(DType::I8, {ggml_ ? 0 : int64_t(layers_.size()) * slots_ * expert_bytes_});
  for (auto& layer : layers_) {
    layer->weights.resize(size_t(experts_));
    layer->slot_expert.assign(size_t(slots_), -1);
    layer->slot_loading.assign(size_t(slots_), 0);
    layer->slot_prefetched.assign(size_t(slots_), 0);
    layer->slot_pins.assign(size_t(slots_), 0);
    layer->slot_used.assign(size_t(slots_), 0);
    layer->expert_slot.assign(size_t(experts_), -1);
    layer->uses.assign(size_t(experts_), 0);
    layer->predicted.assign(size_t(experts_), 0);
    layer->checked = std::vector<std::atomic<bool>>(size_t(experts_));
    layer->stats.routed.assign(size_t(experts_), 0);
    for (auto* v : {&layer->needed, &layer->group, &layer->missing, &layer->missing_slots, &layer->picks})
      v->reserve(size_t(experts_));
  }
  queue_.resize(layers_.size());
  for (size_t l = 0; l < queue_.size(); ++l) {
    queue_[l].layer = int(l);
    queue_[l].experts.reserve(size_t(experts_));
  }
  if (options_.prefetch && layers_.size() > 1) io_thread_ = std::thread([this] { prefetch_loop(); });
}

ExpertOffload::~ExpertOffload() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_wake_.notify_all();
  if (io_thread_.joinable()) io_thread_.join();
}

void ExpertOffload::check_scales(const Layer& layer, int64_t e) const {
  for (const Source& s : layer.sources[size_t(e)]) {
    if (s.ggml) {
      ggml_blocks_of(*weights_, s.name, *s.ggml, s.rows, s.cols);
      continue;
    }
    if (s.block == 0) {
      check_mxfp4_weight(*weights_, s.name, weights_->file_of(s.name));
      continue;
    }
    const Tensor scales = weights_->get(s.scale);
    check_int8_scales(scales.data<float>(), scales.numel(), weights_->file_of(s.name), s.name);
  }
}

void ExpertOffload::will_need(const Layer& layer, int64_t e) const {
  for (const Source& s : layer.sources[size_t(e)]) {
    weights_->advise(s.name, MapAdvice::WillNeed);
    if (!s.ggml) weights_->advise(s.scale, MapAdvice::WillNeed);
  }
}

void ExpertOffload::evict(const Layer& layer, int64_t e) const {
  if (!ggml_) return;
  for (const Source& s : layer.sources[size_t(e)]) weights_->advise(s.name, MapAdvice::Release);
}

void ExpertOffload::pack(Layer& layer, int64_t e, int64_t slot) {
  if (ggml_) {
    const auto& s = layer.sources[size_t(e)];
    for (const Source& source : s) weights_->advise(source.name, MapAdvice::Populate);  // one call, not a fault a page
    GgmlMatrix m[3];
    for (int i = 0; i < 3; ++i) {
      const Source& source = s[size_t(i)];
      m[i] = layer.checked[size_t(e)] ? GgmlMatrix{weights_->mapped_source(source.name)->begin, *source.ggml, source.rows,
                                                   source.cols}
                                      : ggml_blocks_of(*weights_, source.name, *source.ggml, source.rows, source.cols);
    }
    layer.checked[size_t(e)] = true;  // the file's bytes do not change under a read-only map
    layer.weights[size_t(e)] = GgmlExpertWeights{m[0], m[1], m[2]};
    return;
  }
  uint8_t* dst = static_cast<uint8_t*>(slot_memory_.raw()) + (layer.index * slots_ + slot) * expert_bytes_;
  Int8PackedMatrix int8[3];
  Mxfp4PackedMatrix mxfp4[3];
  int64_t offset = 0;
  for (int m = 0; m < 3; ++m) {
    const Source& s = layer.sources[size_t(e)][size_t(m)];
    if (s.block > 0) {
      const Tensor values = weights_->get(s.name), scales = weights_->get(s.scale);
      check_int8_scales(scales.data<float>(), scales.numel(), weights_->file_of(s.name), s.name);
      int8_pack(values.data<int8_t>(), scales.data<float>(), s.rows, s.cols, s.block, dst + offset);
      int8[m] = {dst + offset, s.rows, s.cols, s.block};
    } else {
      pack_mxfp4_weight(*weights_, s.name, s.rows, s.cols, dst + offset, weights_->file_of(s.name));
      mxfp4[m] = {dst + offset, s.rows, s.cols};
    }
    offset += m < 2 ? gate_bytes_ : down_bytes_;
  }
  if (layer.sources[size_t(e)][0].block > 0) layer.weights[size_t(e)] = Int8ExpertWeights{int8[0], int8[1], int8[2]};
  else layer.weights[size_t(e)] = Mxfp4ExpertWeights{mxfp4[0], mxfp4[1], mxfp4[2]};
}

int64_t ExpertOffload::victim(Layer& layer) const {
  int64_t best = -1;
  for (int64_t s = 0; s < slots_; ++s) {
    if (layer.slot_pins[size_t(s)] > 0 || layer.slot_loading[size_t(s)] || layer.slot_prefetched[size_t(s)]) continue;
    const int32_t e = layer.slot_expert[size_t(s)];
    if (e < 0) return s;
    if (best < 0) {
      best = s;
      continue;
    }
    const int32_t b = layer.slot_expert[size_t(best)];
    const bool older = layer.slot_used[size_t(s)] < layer.slot_used[size_t(best)];
    if (options_.policy == ExpertCachePolicy::Lru) {
      if (older) best = s;
    } else if (layer.uses[size_t(e)] < layer.uses[size_t(b)] ||
               (layer.uses[size_t(e)] == layer.uses[size_t(b)] && older)) {
      best = s;
    }
  }
  return best;
}

void ExpertOffload::count_tokens(int64_t rows) {
  tokens_ += rows;
  ++forward_;
}

void ExpertOffload::run(int index, const ExpertDispatch& dispatch, int64_t first, int64_t last,
                        const Compute& compute) {
  Layer& layer = *layers_[size_t(index)];
  const int64_t forward = forward_.load();
  layer.needed.clear();
  for (int64_t e = first; e < last; ++e)
    if (dispatch.load[size_t(e)] > 0) layer.needed.push_back(int32_t(e));
  {
    std::lock_guard<std::mutex> lock(layer.mutex);
    for (int64_t e = first; e < last; ++e) layer.stats.routed[size_t(e)] += dispatch.load[size_t(e)];
    // Prefetched experts are fair game from now on: their forward has reached the layer.
    std::fill(layer.slot_prefetched.begin(), layer.slot_prefetched.end(), 0);
    if (layer.reached_forward != forward && layer.predicted_forward == forward) {  // once per forward
      int64_t predicted = 0, used = 0;
      for (int64_t e = 0; e < experts_; ++e) predicted += layer.predicted[size_t(e)];
      for (int32_t e : layer.needed) used += layer.predicted[size_t(e)];
      layer.stats.predicted += predicted, layer.stats.predicted_used += used;
      layer.stats.predicted_needed += int64_t(layer.needed.size());
    }
    layer.reached_forward = forward;
  }
  for (size_t at = 0; at < layer.needed.size();) {
    const size_t end = std::min(layer.needed.size(), at + size_t(slots_));
    layer.group.assign(layer.needed.begin() + ptrdiff_t(at), layer.needed.begin() + ptrdiff_t(end));
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(layer.mutex);
    layer.missing.clear(), layer.missing_slots.clear();
    for (int32_t e : layer.group) {
      ++layer.tick;
      layer.uses[size_t(e)] += 1;
      if (++layer.uses_since_halving >= experts_) {
        for (int64_t& u : layer.uses) u /= 2;
        layer.uses_since_halving = 0;
      }
      const int32_t s = layer.expert_slot[size_t(e)];
      ++layer.stats.requests;
      if (s >= 0) {
        ++layer.stats.hits;
        ++layer.slot_pins[size_t(s)];
        layer.slot_used[size_t(s)] = layer.tick;
      } else {
        layer.missing.push_back(e);
      }
    }
    for (int32_t e : layer.missing) {
      int64_t s = victim(layer);
      while (s < 0) {  // every other slot is being prefetched: one of them lands soon
        layer.loaded.wait(lock);
        s = victim(layer);
      }
      if (const int32_t old = layer.slot_expert[size_t(s)]; old >= 0) layer.expert_slot[size_t(old)] = -1, evict(layer, old);
      layer.slot_expert[size_t(s)] = e, layer.expert_slot[size_t(e)] = int32_t(s);
      layer.slot_loading[size_t(s)] = 1, ++layer.slot_pins[size_t(s)], layer.slot_used[size_t(s)] = layer.tick;
      layer.missing_slots.push_back(int32_t(s));
    }
    lock.unlock();
    for (int32_t e : layer.missing) will_need(layer, e);
    FirstException failure;
    const int64_t misses = int64_t(layer.missing.size());
#pragma omp parallel for schedule(dynamic, 1) if (misses > 1)
    for (int64_t i = 0; i < misses; ++i)
      failure.run([&] { pack(layer, layer.missing[size_t(i)], layer.missing_slots[size_t(i)]); });
    const bool failed = failure.failed();
    // The packed copies are in the slots: the file's pages leave this process (the page cache keeps
    // them), so that resident memory is the slots, not the experts read so far.
    if (misses > 0 && !ggml_) weights_->release_pages();
    lock.lock();
    for (int32_t s : layer.missing_slots) {
      layer.slot_loading[size_t(s)] = 0;
      if (failed) {  // a fetch failed: leave no half-packed expert behind
        layer.expert_slot[size_t(layer.slot_expert[size_t(s)])] = -1;
        layer.slot_expert[size_t(s)] = -1;
        --layer.slot_pins[size_t(s)];
      }
    }
    layer.stats.fetches += misses, layer.stats.fetched_bytes += misses * expert_bytes_;
    layer.loaded.notify_all();
    if (failed) {
      for (int32_t e : layer.group)
        if (const int32_t s = layer.expert_slot[size_t(e)]; s >= 0) --layer.slot_pins[size_t(s)];
      failure.rethrow();
    }
    layer.loaded.wait(lock, [&] {
      return std::none_of(layer.group.begin(), layer.group.end(),
                          [&](int32_t e) { return layer.slot_loading[size_t(layer.expert_slot[size_t(e)])] != 0; });
    });
    layer.stats.stall_seconds += seconds_since(t0);
    lock.unlock();

    compute(layer.group.front(), layer.group.back() + 1, layer.weights);

    lock.lock();
    for (int32_t e : layer.group) --layer.slot_pins[size_t(layer.expert_slot[size_t(e)])];
    lock.unlock();
    layer.loaded.notify_all();
    at = end;
  }
}

void ExpertOffload::predict_next(int index, const float* u, int64_t n, Arena& scratch) {
  if (!io_thread_.joinable() || size_t(index) + 1 >= layers_.size() || n > kMaxPredictedRows) return;
  Layer& next = *layers_[size_t(index) + 1];
  const Router& router = *next.router;
  Frame frame(scratch);
  Routing routing{n, experts_, k_};
  routing.scores = frame.take<float>(n * experts_);
  routing.selected = frame.take<int32_t>(n * k_);
  routing.weights = frame.take<float>(n * k_);
  if (router.latent() > 0) routing.latent = frame.take<float>(n * router.latent());
  router.route_into(u, routing);
  const int64_t forward = forward_.load();
  std::vector<int32_t>& picks = next.picks;  // capacity E: no allocation per token
  picks.clear();
  {
    std::lock_guard<std::mutex> lock(next.mutex);
    std::fill(next.predicted.begin(), next.predicted.end(), 0);
    for (int64_t i = 0; i < n * k_; ++i) {
      const int32_t e = routing.selected[i];
      if (!next.predicted[size_t(e)]) picks.push_back(e);
      next.predicted[size_t(e)] = 1;
    }
    next.predicted_forward = forward;
  }
  if (int64_t(picks.size()) > slots_) return;  // more than the layer holds: it would evict its own picks
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    PrefetchRequest& request = queue_[size_t(index) + 1];
    request.pending = true, request.forward = forward;
    request.experts.assign(picks.begin(), picks.end());
  }
  queue_wake_.notify_one();
}

void ExpertOffload::prefetch_loop() {
  PrefetchRequest request;  // its experts are swapped with a queue entry's: both keep capacity E
  request.experts.reserve(size_t(experts_));
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      const auto pending = [](const PrefetchRequest& r) { return r.pending; };
      queue_wake_.wait(lock, [&] { return stopping_ || std::any_of(queue_.begin(), queue_.end(), pending); });
      if (stopping_) return;
      // The shallowest layer first: its forward reaches it first.
      PrefetchRequest& next = *std::find_if(queue_.begin(), queue_.end(), pending);
      request.layer = next.layer, request.forward = next.forward;
      request.experts.swap(next.experts);
      next.pending = false;
    }
    Layer& layer = *layers_[size_t(request.layer)];
    {
      std::lock_guard<std::mutex> lock(layer.mutex);
      for (int32_t e : request.experts)
        if (layer.expert_slot[size_t(e)] < 0) will_need(layer, e);
    }
    for (int32_t e : request.experts) {
      // Checked before the expert takes a slot, so that a slot a forward may already wait on is
      // always filled; a corrupt expert is left to the compute's own fetch, which reports it.
      try {
        check_scales(layer, e);
      } catch (const Error&) {
        continue;
      }
      std::unique_lock<std::mutex> lock(layer.mutex);
      if (layer.reached_forward >= request.forward) break;  // too late: the layer has run
      if (layer.expert_slot[size_t(e)] >= 0) continue;
      const int64_t s = victim(layer);
      if (s < 0) break;
      if (const int32_t old = layer.slot_expert[size_t(s)]; old >= 0) layer.expert_slot[size_t(old)] = -1, evict(layer, old);
      layer.slot_expert[size_t(s)] = e, layer.expert_slot[size_t(e)] = int32_t(s);
      layer.slot_loading[size_t(s)] = 1, layer.slot_prefetched[size_t(s)] = 1;
      layer.slot_used[size_t(s)] = layer.tick;
      lock.unlock();
      pack(layer, e, s);
      lock.lock();
      layer.slot_loading[size_t(s)] = 0;
      ++layer.stats.fetches, layer.stats.fetched_bytes += expert_bytes_;
      lock.unlock();
      layer.loaded.notify_all();
    }
    if (!ggml_) weights_->release_pages();
  }
}

ExpertOffloadStats ExpertOffload::stats() const {
  ExpertOffloadStats out;
  out.tokens = tokens_.load();
  out.slots_per_layer = slots_, out.experts_per_layer = experts_, out.expert_bytes = expert_bytes_;
  for (const auto& layer : layers_) {
    std::lock_guard<std::mutex> lock(layer->mutex);
    out.layers.push_back(layer->stats);
  }
  return out;
}

std::string ExpertOffload::describe_memory() const {
  const double all = double(expert_bytes_ * experts_ * int64_t(layers_.size()));
  return fmt::format("experts: {} of {} per MoE layer resident ({:.1f} of {:.1f} MiB, {}, prefetch {})", slots_,
                     experts_, double(resident_bytes()) / 0x1p20, all / 0x1p20, expert_cache_policy_name(options_.policy),
                     io_thread_.joinable() ? "on" : "off");
}

std::string ExpertOffload::summary() const {
  const ExpertOffloadStats s = stats();
  const ExpertLayerStats t = s.total();
  return fmt::format("{}; hit rate {:.1f}%, prefetch precision {:.0f}% recall {:.0f}%; per token {:.2f} MB read, {:.3f} ms "
                     "stalled",
                     describe_memory(), 100 * t.hit_rate(), 100 * t.precision(), 100 * t.recall(),
                     s.bytes_per_token() * 1e-6, s.stall_seconds_per_token() * 1e3);
}

void ExpertOffload::reset_stats() {
  tokens_ = 0;
  for (auto& layer : layers_) {
    std::lock_guard<std::mutex> lock(layer->mutex);
    layer->stats = {};
    layer->stats.routed.assign(size_t(experts_), 0);
  }
}

void ExpertOffload::evict_all(bool drop_page_cache) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    for (PrefetchRequest& r : queue_) r.pending = false;
  }
  for (auto& layer : layers_) {
    std::unique_lock<std::mutex> lock(layer->mutex);
    layer->loaded.wait(lock, [&] {
      return std::none_of(layer->slot_loading.begin(), layer->slot_loading.end(), [](uint8_t b) { return b != 0; });
    });
    HYLA_ASSERT(std::all_of(layer->slot_pins.begin(), layer->slot_pins.end(), [](int32_t p) { return p == 0; }));
    std::fill(layer->slot_expert.begin(), layer->slot_expert.end(), -1);
    std::fill(layer->slot_prefetched.begin(), layer->slot_prefetched.end(), 0);
    std::fill(layer->expert_slot.begin(), layer->expert_slot.end(), -1);
    std::fill(layer->uses.begin(), layer->uses.end(), 0);
    layer->uses_since_halving = 0;
  }
  if (drop_page_cache)
    weights_->drop_cached_pages();
}

}  // namespace hyla
