#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>

namespace hyla {

// Physical cores of this machine (hyperthread siblings counted once).
int physical_cores();
// The thread count to use: `requested` if > 0, else $HYLA_THREADS if set, else physical cores.
int resolve_threads(int requested);
// Sets the OpenMP thread count used by hyla's kernels and by oneDNN.
void set_threads(int n);
int num_threads();

// Runs fn on a new thread with this thread's OpenMP thread count, waits for it and rethrows what
// it threw. Every thread that forks keeps its own pool of OpenMP workers until it exits, and when
// more pool threads exist than cores libgomp stops spin-waiting between parallel regions (decoding
// ran 4-6x slower). So work done before an Engine starts, such as loading the model, runs here:
// its pool dies with the thread, and the engine's thread owns the only one.
void run_on_passing_thread(const std::function<void()>& fn);

// Whether a loop over `work` simple element operations is worth waking the thread team: a fork
// and join costs about as much as ~16K such operations, and decoding one token runs hundreds of
// loops over a single row. Used as `#pragma omp parallel for if (worth_parallel(...))`.
constexpr int64_t kParallelGrain = int64_t(1) << 14;
inline bool worth_parallel(int64_t work) { return work >= kParallelGrain; }

// Carries the first exception out of an OpenMP parallel region, where an escaping exception would
// terminate the program: run each iteration's body through run(), then call rethrow() after the region.
class FirstException {
 public:
  template <typename Body>
  void run(Body&& body) noexcept {
    try {
      body();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!first_) first_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (first_) std::rethrow_exception(first_);
  }
  bool failed() const { return first_ != nullptr; }

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace hyla
