#pragma once
#include <exception>
#include <mutex>

namespace hyla {

// Physical cores of this machine (hyperthread siblings counted once).
int physical_cores();
// The thread count to use: `requested` if > 0, else $HYLA_THREADS if set, else physical cores.
int resolve_threads(int requested);
// Sets the OpenMP thread count used by hyla's kernels and by oneDNN.
void set_threads(int n);
int num_threads();

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

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace hyla
