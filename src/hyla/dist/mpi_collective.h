#pragma once
// The Collective over MPI (Debian's OpenMPI): every process that mpirun started is one rank of
// the world collective; split() makes collectives over groups of them (expert parallelism's
// groups and the replicas of an expert).
//
// Every MPI call runs on one communication thread, shared by the world and its splits, that
// initialises MPI (so MPI_THREAD_FUNNELED is all the library must provide): the started
// operations progress there while the calling thread computes, which Debian's OpenMPI, built
// without an asynchronous progress thread, would otherwise do only inside MPI calls. The thread
// drives an operation by testing it: continuously while a caller waits for it (the caller's core
// is idle then, and every test moves a shared-memory fragment along, so sleeping between tests
// would stretch a large transfer many times over), but while the callers compute, spinning only
// briefly and then sleeping between tests, so that a rank with one compute thread per core does
// not lose that core. Operations run one at a time in the order they were posted, across all the
// collectives.
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>

#include "hyla/model/collective.h"

namespace hyla {

// The communication thread and its queue of MPI jobs.
class MpiThread {
 public:
  MpiThread();   // MPI_Init_thread, on the thread
  ~MpiThread();  // MPI_Finalize there, after every posted job
  MpiThread(const MpiThread&) = delete;
  MpiThread& operator=(const MpiThread&) = delete;

  using Job = std::function<void()>;
  void post(Job job);  // runs on the thread, after the jobs posted before it
  void wait();         // until every posted job ran; rethrows a job's exception
  void run(Job job) {
    post(std::move(job));
    wait();
  }
  // On the thread: completes one nonblocking operation, counting its time.
  void complete(MPI_Request& request);
  // On the thread: completes point-to-point operations with `peers` (one each); after
  // `timeout_seconds` (> 0) with some still open, throws ProcessFailure naming their peers.
  void complete_all(std::span<MPI_Request> requests, std::span<const int> peers, double timeout_seconds);
  [[noreturn]] void abort(int code);
  double busy_seconds() const { return double(busy_nanoseconds_.load()) * 1e-9; }

 private:
  void serve();

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  int64_t posted_ = 0, finished_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::atomic<int> abort_code_{-1};
  std::atomic<int> waiting_{0};  // callers blocked in wait()
  std::atomic<int64_t> busy_nanoseconds_{0};
};

class MpiCollective final : public Collective {
 public:
  // The world: starts MPI.
  MpiCollective();
  ~MpiCollective() override;
  MpiCollective(const MpiCollective&) = delete;
  MpiCollective& operator=(const MpiCollective&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(std::span<float> values) override;
  void sum(std::span<double> values) override;
  void sum(std::span<int64_t> values) override;
  void start_sum(std::span<float> values) override;
  void start_reduce_scatter(std::span<const float> values, std::span<const int> counts, float* mine) override;
  void wait() override { thread_->wait(); }
  void all_gather(std::span<float> values, std::span<const int> counts) override;
  void barrier() override;
  void broadcast(std::string& text) override;
  void all_to_all(std::span<const int64_t> send, std::span<int64_t> receive) override;
  void all_to_all_v(const float* send, std::span<const int64_t> send_counts, float* receive,
                    std::span<const int64_t> receive_counts) override;
  std::unique_ptr<Collective> split(int color) override;
  void set_exchange_timeout(double seconds) override { timeout_seconds_ = seconds; }
  double busy_seconds() const override { return thread_->busy_seconds(); }
  int64_t bytes() const override { return bytes_.load(); }

  // Ends every process of the job (MPI_Abort with `code`): after an error on this one, so that
  // no other waits forever in an operation this one will never join.
  [[noreturn]] void abort(int code) { thread_->abort(code); }

 private:
  MpiCollective(std::shared_ptr<MpiThread> thread, MPI_Comm comm);
  template <typename T> void sum_in_place(std::span<T> values, MPI_Datatype type, bool blocking);

  std::shared_ptr<MpiThread> thread_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::atomic<int64_t> bytes_{0};
  double timeout_seconds_ = 0;  // set_exchange_timeout
};

}  // namespace hyla
