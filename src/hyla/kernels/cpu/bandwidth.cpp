#include "hyla/kernels/bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "hyla/core/error.h"
#include "hyla/core/memory.h"
#include "hyla/core/random.h"
#include "hyla/kernels/cpu/vec.h"

namespace hyla {
namespace {

constexpr int64_t kGroup = 4 * vec::kLanes;  // floats a step of the read loop takes

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Adds this thread's share of floats [0, n) of x (n a multiple of kGroup) into acc.
void read_share(vec::Vec (&acc)[4], const float* x, int64_t n, int thread, int threads) {
  const int64_t groups = n / kGroup;
  const int64_t begin = groups * thread / threads * kGroup, end = groups * (thread + 1) / threads * kGroup;
  for (int64_t i = begin; i < end; i += kGroup)
    vec::unroll<4>([&](auto j) { acc[j] = acc[j] + vec::load(x + i + j * vec::kLanes); });
}

float total_of(const vec::Vec (&acc)[4]) { return vec::sum(acc[0] + acc[1] + acc[2] + acc[3]); }

// The best time of `pass` after a warm-up one: at least 5 passes, more while under half a second.
// on_best() runs after each pass that is the best so far.
template <typename Pass, typename OnBest>
double best_pass_seconds(Pass&& pass, OnBest&& on_best) {
  pass();
  double best = 1e30, spent = 0;
  for (int p = 0; p < 5 || (spent < 0.5 && p < 50); ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double s = seconds_since(t0);
    spent += s;
    if (s < best) best = s, on_best();
  }
  return best;
}

// Keeps the compiler from dropping the loads whose sums nobody uses.
void keep(float sink) {
  volatile float kept = sink;
  (void)kept;
}

}  // namespace

double measure_read_bandwidth_gbs(const std::vector<std::span<const std::byte>>& buffers) {
  double bytes = 0;
  for (const auto& b : buffers) bytes += double(int64_t(b.size() / 4) / kGroup * kGroup * 4);
  float sink = 0;
  const double seconds = best_pass_seconds([&] {
    float total = 0;
    for (const auto& b : buffers) {
      const float* x = reinterpret_cast<const float*>(b.data());
      const int64_t n = int64_t(b.size() / 4) / kGroup * kGroup;
#pragma omp parallel reduction(+ : total)
      {
        vec::Vec acc[4] = {vec::zero(), vec::zero(), vec::zero(), vec::zero()};
        read_share(acc, x, n, omp_get_thread_num(), omp_get_num_threads());
        total += total_of(acc);
      }
    }
    sink += total;
  }, [] {});
  keep(sink);
  return bytes / seconds * 1e-9;
}

double measure_read_bandwidth_gbs(size_t bytes) {
  const int64_t n = int64_t(bytes / sizeof(float));
  const auto memory = allocate_aligned(size_t(n) * sizeof(float));
  float* x = static_cast<float*>(memory.get());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  return measure_read_bandwidth_gbs({std::span<const std::byte>(static_cast<const std::byte*>(memory.get()), size_t(n) * 4)});
}

TokenReadBench::TokenReadBench(int64_t max_reread, int64_t moe_layers, int64_t experts, int64_t expert_bytes)
    : max_reread_(max_reread), moe_layers_(moe_layers), experts_(experts), expert_bytes_(expert_bytes) {
  HYLA_ASSERT(max_reread >= 0 && moe_layers >= 0 && experts >= 0 && expert_bytes >= 0);
  // Floats: a slice of the re-read bytes or an expert is at least one step of the loop.
  const auto fill = [](int64_t floats) {
    const int64_t n = floats + kGroup;
    std::shared_ptr<void> memory = allocate_aligned(size_t(n) * 4);
    float* x = static_cast<float*>(memory.get());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
    return memory;
  };
  reread_ = fill(std::max(max_reread / 4, std::max<int64_t>(moe_layers, 1) * kGroup));
  // The routed reads must come from DRAM, not a cache: a pool of whole layers' experts up to
  // kPoolBytes does that; every layer's experts at once would be a second copy of the model's
  // experts in memory (17 GB for a 48B file), which pushed the model's own pages out.
  constexpr int64_t kPoolBytes = int64_t(1) << 30;
  pool_layers_ = std::clamp<int64_t>(kPoolBytes / std::max<int64_t>(experts * expert_bytes, 1), 1, std::max<int64_t>(moe_layers, 1));
  pool_ = fill(std::min(moe_layers, pool_layers_) * experts * (expert_bytes / 4));
}

TokenReadTime TokenReadBench::measure(int64_t reread, int64_t picked) const {
  HYLA_ASSERT(reread >= 0 && reread <= max_reread_ && picked >= 0 && picked <= experts_);
  if (moe_layers_ == 0) picked = 0;
  const int64_t slices = std::max<int64_t>(moe_layers_, 1);
  const int64_t slice = std::max<int64_t>(1, reread / 4 / slices / kGroup) * kGroup;  // floats
  const int64_t expert = std::max<int64_t>(1, expert_bytes_ / 4 / kGroup) * kGroup;
  const int64_t pool_stride = expert_bytes_ / 4;
  const int64_t reread_read = slice * slices * 4, routed_read = expert * picked * moe_layers_ * 4;
  const double token_bytes = double(reread_read + routed_read);
  // Tokens per pass: enough that a pass reads ~256 MB (at least 16 tokens), each token its own
  // random picks (k distinct of E per layer: a partial shuffle), the same in every pass.
  const int64_t tokens = std::clamp<int64_t>(int64_t(double(int64_t(1) << 28) / std::max(token_bytes, 1.0)), 16, 256);
  std::vector<int32_t> picks(size_t(tokens * moe_layers_ * picked));
  Rng rng(7);
  std::vector<int32_t> order(static_cast<size_t>(experts_));
  for (size_t i = 0; i < picks.size(); i += size_t(std::max<int64_t>(picked, 1))) {
    std::iota(order.begin(), order.end(), 0);
    for (int64_t j = 0; j < picked; ++j) {
      std::swap(order[size_t(j)], order[size_t(j + int64_t(rng.below(uint64_t(experts_ - j))))]);
      picks[i + size_t(j)] = order[size_t(j)];
    }
  }
  const float* reread_floats = static_cast<const float*>(reread_.get());
  const float* pool = static_cast<const float*>(pool_.get());
  float sink = 0;
  double reread_seconds = 0, routed_seconds = 0;  // thread 0's split of the last pass
  double best_reread = 0, best_routed = 0;        // and of the best one
  const double seconds = best_pass_seconds([&] {
    float total = 0;
    double reread_s = 0, routed_s = 0;
#pragma omp parallel reduction(+ : total)
    {
      const int thread = omp_get_thread_num(), threads = omp_get_num_threads();
      vec::Vec acc[4] = {vec::zero(), vec::zero(), vec::zero(), vec::zero()};
      double own_reread = 0, own_routed = 0;
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t l = 0; l < slices; ++l) {
          auto t0 = std::chrono::steady_clock::now();
          read_share(acc, reread_floats + l * slice, slice, thread, threads);
          own_reread += seconds_since(t0);
          if (l >= moe_layers_) continue;
          t0 = std::chrono::steady_clock::now();
          const int32_t* chosen = picks.data() + (t * moe_layers_ + l) * picked;
          for (int64_t j = 0; j < picked; ++j)
            read_share(acc, pool + ((l % pool_layers_) * experts_ + chosen[j]) * pool_stride, expert, thread, threads);
          own_routed += seconds_since(t0);
        }
      total += total_of(acc);
      if (thread == 0) reread_s = own_reread, routed_s = own_routed;
    }
    sink += total;
    reread_seconds = reread_s, routed_seconds = routed_s;
  }, [&] { best_reread = reread_seconds, best_routed = routed_seconds; });
  keep(sink);
  const double per_token = seconds / double(tokens), measured = std::max(best_reread + best_routed, 1e-30);
  return {per_token, per_token * best_reread / measured, per_token * best_routed / measured, reread_read, routed_read};
}

}  // namespace hyla
