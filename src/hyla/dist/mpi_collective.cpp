#include "hyla/dist/mpi_collective.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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

void MpiThread::complete_all(std::span<MPI_Request> requests, std::span<const int> peers, double timeout_seconds) {
  HYLA_ASSERT(requests.size() == peers.size());
  const auto start = Clock::now();
  std::vector<char> done(requests.size(), 0);
  for (size_t left = requests.size(); left > 0;) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (done[i]) continue;
      int finished = 0;
      MPI_Test(&requests[i], &finished, MPI_STATUS_IGNORE);
      if (finished) done[i] = 1, --left;
    }
    if (left == 0) break;
    if (abort_code_.load() >= 0) MPI_Abort(MPI_COMM_WORLD, abort_code_.load());
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (timeout_seconds > 0 && waited > timeout_seconds) {
      std::vector<int> silent;
      for (size_t i = 0; i < requests.size(); ++i)
        if (!done[i] && std::find(silent.begin(), silent.end(), peers[i]) == silent.end()) silent.push_back(peers[i]);
      std::string names;
      for (int r : silent) names += (names.empty() ? "" : ", ") + std::to_string(r);
      throw ProcessFailure(fmt::format("process{} {} of the job answered nothing for {:g} s (killed, stopped or cut "
                                       "off; --exchange-timeout): the job cannot go on",
                                       silent.size() == 1 ? "" : "es", names, timeout_seconds),
                           silent);
    }
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

// Point to point, so that a process that answers nothing is named (a collective operation
// cannot say which process it waits for). Messages between two processes arrive in the order
// sent, and operations run one at a time, so one tag serves every exchange.
constexpr int kExchangeTag = 17;

void MpiCollective::broadcast(std::string& text) {
  thread_->run([this, &text] {
    int64_t length = int64_t(text.size());
    if (rank_ != 0) {  // waiting for rank 0 is idle time, not a fault: no timeout
      MPI_Request r;
      MPI_Irecv(&length, 1, MPI_INT64_T, 0, kExchangeTag, comm_, &r);
      thread_->complete(r);
      text.resize(size_t(length));
      MPI_Irecv(text.data(), count_of(text.size()), MPI_CHAR, 0, kExchangeTag, comm_, &r);
      thread_->complete(r);
      return;
    }
    std::vector<MPI_Request> requests;
    std::vector<int> peers;
    for (int q = 1; q < size_; ++q) {
      MPI_Request r;
      MPI_Isend(&length, 1, MPI_INT64_T, q, kExchangeTag, comm_, &r);
      requests.push_back(r), peers.push_back(q);
      MPI_Isend(text.data(), count_of(text.size()), MPI_CHAR, q, kExchangeTag, comm_, &r);
      requests.push_back(r), peers.push_back(q);
    }
    thread_->complete_all(requests, peers, timeout_seconds_);
  });
}

namespace {

// Block q of `send` (bytes out[q] at out_at[q]) to process q and block q of `receive` from it;
// this process's own block is copied.
void exchange_blocks(MpiThread& thread, MPI_Comm comm, int rank, int size, const char* send, const std::vector<int64_t>& out,
                     const std::vector<int64_t>& out_at, char* receive, const std::vector<int64_t>& in,
                     const std::vector<int64_t>& in_at, double timeout_seconds) {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  for (int q = 0; q < size; ++q) {
    if (q == rank || in[size_t(q)] == 0) continue;
    MPI_Request r;
    MPI_Irecv(receive + in_at[size_t(q)], count_of(size_t(in[size_t(q)])), MPI_BYTE, q, kExchangeTag, comm, &r);
    requests.push_back(r), peers.push_back(q);
  }
  HYLA_ASSERT(out[size_t(rank)] == in[size_t(rank)]);
  if (out[size_t(rank)] > 0) std::memcpy(receive + in_at[size_t(rank)], send + out_at[size_t(rank)], size_t(out[size_t(rank)]));
  for (int q = 0; q < size; ++q) {
    if (q == rank || out[size_t(q)] == 0) continue;
    MPI_Request r;
    MPI_Isend(send + out_at[size_t(q)], count_of(size_t(out[size_t(q)])), MPI_BYTE, q, kExchangeTag, comm, &r);
    requests.push_back(r), peers.push_back(q);
  }
  thread.complete_all(requests, peers, timeout_seconds);
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& bytes) {
  std::vector<int64_t> at(bytes.size(), 0);
  for (size_t q = 1; q < bytes.size(); ++q) at[q] = at[q - 1] + bytes[q - 1];
  return at;
}

}  // namespace

void MpiCollective::all_to_all(std::span<const int64_t> send, std::span<int64_t> receive) {
  HYLA_ASSERT(send.size() == receive.size() && send.size() % size_t(size_) == 0);
  bytes_ += int64_t(send.size_bytes());
  thread_->run([this, send, receive] {
    const std::vector<int64_t> block(size_t(size_), int64_t(send.size_bytes() / size_t(size_)));
    const std::vector<int64_t> at = offsets_of(block);
    exchange_blocks(*thread_, comm_, rank_, size_, reinterpret_cast<const char*>(send.data()), block, at,
                    reinterpret_cast<char*>(receive.data()), block, at, timeout_seconds_);
  });
}

void MpiCollective::all_to_all_v(const float* send, std::span<const int64_t> send_counts, float* receive,
                                 std::span<const int64_t> receive_counts) {
  HYLA_ASSERT(int(send_counts.size()) == size_ && int(receive_counts.size()) == size_);
  for (int64_t c : send_counts) bytes_ += c * 4;
  thread_->run([&] {
    std::vector<int64_t> out, in;
    for (int64_t c : send_counts) out.push_back(c * int64_t(sizeof(float)));
    for (int64_t c : receive_counts) in.push_back(c * int64_t(sizeof(float)));
    exchange_blocks(*thread_, comm_, rank_, size_, reinterpret_cast<const char*>(send), out, offsets_of(out),
                    reinterpret_cast<char*>(receive), in, offsets_of(in), timeout_seconds_);
  });
}

std::unique_ptr<Collective> MpiCollective::split(int color) {
  MPI_Comm group = MPI_COMM_NULL;
  thread_->run([&] { MPI_Comm_split(comm_, color, rank_, &group); });
  return std::unique_ptr<Collective>(new MpiCollective(thread_, group));
}

}  // namespace hyla
