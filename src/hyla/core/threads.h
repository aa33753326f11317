#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

namespace hyla {

// Physical cores of the CPUs this process may run on (its affinity mask; hyperthread siblings
// counted once).
int physical_cores();
// The thread count to use: `requested` if > 0, else $HYLA_THREADS if set, else physical cores.
int resolve_threads(int requested);

// How many threads this thread's work uses: a fixed count, or by default (`adaptive`) the count
// less the cores other processes keep busy (forward_threads). Per thread, like OpenMP's count.
struct ThreadConfig {
  int threads = 1;
  bool adaptive = false;
};
// The CLI's -t/--threads: `requested` if > 0, else $HYLA_THREADS, both fixed; else the physical
// cores, adaptive.
ThreadConfig thread_config_for(int requested);
void set_thread_config(const ThreadConfig& config);
ThreadConfig thread_config();
// Sets a fixed thread count for hyla's kernels and oneDNN (set_thread_config({n, false})).
void set_threads(int n);
// The threads the calling thread's parallel work uses now: the decode team's while one drives
// this thread, else OpenMP's.
int num_threads();

// The threads a forward should use: the configured count, or when adaptive that count less the
// cores that other processes kept busy over the last sampling interval (/proc/stat less this
// process's own CPU time, sampled at most every kLoadInterval), at least one. Spinning barriers
// wait on a partner that a busy box has descheduled: with one CPU-bound process beside it,
// decode on both cores of a 2-core box ran 4x slower than on one.
int forward_threads();
constexpr double kLoadIntervalSeconds = 0.25;

// Cores busy outside this process over an interval, from two samples of the box's CPU time and
// this process's (the CPUs of `cpus` only; time stolen by the hypervisor counts as busy).
struct CpuSample {
  double busy_seconds = 0, own_seconds = 0, at_seconds = 0;
};
CpuSample sample_cpu_time(const std::vector<int>& cpus);
double cores_busy_elsewhere(const CpuSample& before, const CpuSample& after);
// The CPUs of this process's affinity mask.
std::vector<int> allowed_cpus();

// Runs fn on a new thread with this thread's thread configuration, waits for it and rethrows what
// it threw. Every thread that forks keeps its own pool of OpenMP workers until it exits, and when
// more pool threads exist than cores libgomp stops spin-waiting between parallel regions (decoding
// ran 4-6x slower). So work done before an Engine starts, such as loading the model, runs here:
// its pool dies with the thread, and the engine's thread owns the only one.
void run_on_passing_thread(const std::function<void()>& fn);

// Whether a loop over `work` simple element operations is worth waking the thread team: a fork
// and join costs about as much as ~16K such operations, and decoding one token runs hundreds of
// loops over a single row. Row loops ask through parallel_rows (core/team.h).
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
