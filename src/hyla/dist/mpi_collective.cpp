#include "hyla/dist/mpi_collective.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <future>
#include <utility>
#include <vector>

#include "hyla/core/error.h"

namespace hyla {
namespace {

using Clock = std::chrono::steady_clock;

// A started operation is tested continuously this long, then once per sleep: short reductions
// (loss sums, balancing counts) finish at full speed, long ones cost a core only briefly.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kSleep = std::chrono::microseconds(20);

int count_of(size_t n) {
  HYLA_ASSERT(n <= size_t(INT_MAX));
  return int(n);
}

}  // namespace

MpiCollective::MpiCollective() {
  std::promise<void> started;
  thread_ = std::thread([&] {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    started.set_value();
    serve();
    MPI_Finalize();
  });
  started.get_future().wait();
}

MpiCollective::~MpiCollective() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void MpiCollective::serve() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return !jobs_.empty() || stopping_ || abort_code_.load() >= 0; });
      if (abort_code_.load() >= 0) MPI_Abort(MPI_COMM_WORLD, abort_code_.load());
      if (jobs_.empty()) return;  // stopping, every job done
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      ++finished_;
    }
    changed_.notify_all();
  }
}

void MpiCollective::complete(void* request) {
  MPI_Request* r = static_cast<MPI_Request*>(request);
  const auto start = Clock::now();
  int done = 0;
  for (;;) {
    MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (abort_code_.load() >= 0) MPI_Abort(MPI_COMM_WORLD, abort_code_.load());
    if (Clock::now() - start > kSpin) std::this_thread::sleep_for(kSleep);
  }
  busy_nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

void MpiCollective::post(Job job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    ++posted_;
  }
  changed_.notify_all();
}

void MpiCollective::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return finished_ == posted_; });
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void MpiCollective::run(Job job) {
  post(std::move(job));
  wait();
}

void MpiCollective::sum(std::span<float> values) {
  bytes_ += int64_t(values.size_bytes());
  run([this, values] {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::sum(std::span<double> values) {
  bytes_ += int64_t(values.size_bytes());
  run([this, values] {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::sum(std::span<int64_t> values) {
  bytes_ += int64_t(values.size_bytes());
  run([this, values] {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::start_sum(std::span<float> values) {
  bytes_ += int64_t(values.size_bytes());
  post([this, values] {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::start_reduce_scatter(std::span<const float> values, std::span<const int> counts, float* mine) {
  HYLA_ASSERT(int(counts.size()) == size_);
  bytes_ += int64_t(values.size_bytes());
  post([this, values, parts = std::vector<int>(counts.begin(), counts.end()), mine] {
    MPI_Request r;
    MPI_Ireduce_scatter(values.data(), mine, parts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::all_gather(std::span<float> values, std::span<const int> counts) {
  HYLA_ASSERT(int(counts.size()) == size_);
  bytes_ += int64_t(counts[size_t(rank_)]) * 4;
  run([this, values, counts] {
    std::vector<int> displacements(counts.size(), 0);
    for (size_t r = 1; r < counts.size(); ++r) displacements[r] = displacements[r - 1] + counts[r - 1];
    HYLA_ASSERT(size_t(displacements.back()) + size_t(counts.back()) == values.size());
    MPI_Request r;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts.data(), displacements.data(), MPI_FLOAT,
                    MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::barrier() {
  run([this] {
    MPI_Request r;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::broadcast(std::string& text) {
  run([this, &text] {
    int64_t length = int64_t(text.size());
    MPI_Request r;
    MPI_Ibcast(&length, 1, MPI_INT64_T, 0, MPI_COMM_WORLD, &r);
    complete(&r);
    text.resize(size_t(length));
    MPI_Ibcast(text.data(), count_of(text.size()), MPI_CHAR, 0, MPI_COMM_WORLD, &r);
    complete(&r);
  });
}

void MpiCollective::abort(int code) {
  {
    std::lock_guard lock(mutex_);
    abort_code_ = code;
  }
  changed_.notify_all();
  // The communication thread aborts at its next test or wake-up; if it is stuck inside MPI, the
  // process ends itself (mpirun then ends the others).
  std::this_thread::sleep_for(std::chrono::seconds(5));
  std::_Exit(code);
}

}  // namespace hyla
