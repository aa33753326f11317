#include "hyla/dist/mpi_collective.h"

#include <chrono>
#include <climits>
#include <future>
#include <utility>
#include <vector>

#include "hyla/core/error.h"

namespace hyla {
namespace {

using Clock = std::chrono::steady_clock;

// While no caller waits, a started operation is tested continuously this long, then once per
// sleep: short reductions finish at full speed, long ones cost a computing core only briefly.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kSleep = std::chrono::microseconds(20);

int count_of(size_t n) {
  HYLA_ASSERT(n <= size_t(INT_MAX));
  return int(n);
}

std::vector<int> ints(std::span<const int64_t> values) {
  std::vector<int> out;
  for (int64_t v : values) out.push_back(count_of(size_t(v)));
  return out;
}

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> at(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) at[r] = at[r - 1] + counts[r - 1];
  return at;
}

}  // namespace

MpiThread::MpiThread() {
  std::promise<void> started;
  thread_ = std::thread([&] {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    started.set_value();
    serve();
    MPI_Finalize();
  });
  started.get_future().wait();
}

MpiThread::~MpiThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void MpiThread::serve() {
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

void MpiThread::complete(MPI_Request& request) {
  const auto start = Clock::now();
  int done = 0;
  for (;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (abort_code_.load() >= 0) MPI_Abort(MPI_COMM_WORLD, abort_code_.load());
    if (waiting_.load(std::memory_order_relaxed) == 0 && Clock::now() - start > kSpin) std::this_thread::sleep_for(kSleep);
  }
  busy_nanoseconds_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

void MpiThread::post(Job job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    ++posted_;
  }
  changed_.notify_all();
}

void MpiThread::wait() {
  std::unique_lock lock(mutex_);
  ++waiting_;
  changed_.wait(lock, [&] { return finished_ == posted_; });
  --waiting_;
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void MpiThread::abort(int code) {
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

MpiCollective::MpiCollective() : thread_(std::make_shared<MpiThread>()) {
  thread_->run([this] {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  });
}

MpiCollective::MpiCollective(std::shared_ptr<MpiThread> thread, MPI_Comm comm) : thread_(std::move(thread)), comm_(comm) {
  thread_->run([this] {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  });
}

MpiCollective::~MpiCollective() {
  thread_->run([this] { MPI_Comm_free(&comm_); });
}

template <typename T>
void MpiCollective::sum_in_place(std::span<T> values, MPI_Datatype type, bool blocking) {
  bytes_ += int64_t(values.size_bytes());
  thread_->post([this, values, type] {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, values.data(), count_of(values.size()), type, MPI_SUM, comm_, &r);
    thread_->complete(r);
  });
  if (blocking) thread_->wait();
}

void MpiCollective::sum(std::span<float> values) { sum_in_place(values, MPI_FLOAT, true); }
void MpiCollective::sum(std::span<double> values) { sum_in_place(values, MPI_DOUBLE, true); }
void MpiCollective::sum(std::span<int64_t> values) { sum_in_place(values, MPI_INT64_T, true); }
void MpiCollective::start_sum(std::span<float> values) { sum_in_place(values, MPI_FLOAT, false); }

void MpiCollective::start_reduce_scatter(std::span<const float> values, std::span<const int> counts, float* mine) {
  HYLA_ASSERT(int(counts.size()) == size_);
  bytes_ += int64_t(values.size_bytes());
  thread_->post([this, values, parts = std::vector<int>(counts.begin(), counts.end()), mine] {
    MPI_Request r;
    MPI_Ireduce_scatter(values.data(), mine, parts.data(), MPI_FLOAT, MPI_SUM, comm_, &r);
    thread_->complete(r);
  });
}

void MpiCollective::all_gather(std::span<float> values, std::span<const int> counts) {
  HYLA_ASSERT(int(counts.size()) == size_);
  bytes_ += int64_t(counts[size_t(rank_)]) * 4;
  thread_->run([this, values, counts] {
    const std::vector<int> parts(counts.begin(), counts.end()), at = displacements(parts);
    HYLA_ASSERT(size_t(at.back()) + size_t(parts.back()) == values.size());
    MPI_Request r;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), parts.data(), at.data(), MPI_FLOAT, comm_, &r);
    thread_->complete(r);
  });
}

void MpiCollective::barrier() {
  thread_->run([this] {
    MPI_Request r;
    MPI_Ibarrier(comm_, &r);
    thread_->complete(r);
  });
}

void MpiCollective::broadcast(std::string& text) {
  thread_->run([this, &text] {
    int64_t length = int64_t(text.size());
    MPI_Request r;
    MPI_Ibcast(&length, 1, MPI_INT64_T, 0, comm_, &r);
    thread_->complete(r);
    text.resize(size_t(length));
    MPI_Ibcast(text.data(), count_of(text.size()), MPI_CHAR, 0, comm_, &r);
    thread_->complete(r);
  });
}

void MpiCollective::all_to_all(std::span<const int64_t> send, std::span<int64_t> receive) {
  HYLA_ASSERT(send.size() == receive.size() && send.size() % size_t(size_) == 0);
  bytes_ += int64_t(send.size_bytes());
  thread_->run([this, send, receive] {
    MPI_Request r;
    MPI_Ialltoall(send.data(), count_of(send.size() / size_t(size_)), MPI_INT64_T, receive.data(),
                  count_of(receive.size() / size_t(size_)), MPI_INT64_T, comm_, &r);
    thread_->complete(r);
  });
}

void MpiCollective::all_to_all_v(const float* send, std::span<const int64_t> send_counts, float* receive,
                                 std::span<const int64_t> receive_counts) {
  HYLA_ASSERT(int(send_counts.size()) == size_ && int(receive_counts.size()) == size_);
  for (int64_t c : send_counts) bytes_ += c * 4;
  thread_->run([&] {
    const std::vector<int> out = ints(send_counts), in = ints(receive_counts);
    const std::vector<int> out_at = displacements(out), in_at = displacements(in);
    MPI_Request r;
    MPI_Ialltoallv(send, out.data(), out_at.data(), MPI_FLOAT, receive, in.data(), in_at.data(), MPI_FLOAT, comm_, &r);
    thread_->complete(r);
  });
}

std::unique_ptr<Collective> MpiCollective::split(int color) {
  MPI_Comm group = MPI_COMM_NULL;
  thread_->run([&] { MPI_Comm_split(comm_, color, rank_, &group); });
  return std::unique_ptr<Collective>(new MpiCollective(thread_, group));
}

}  // namespace hyla
