#pragma once
// The Collective over MPI (Debian's OpenMPI): every process that mpirun started is one rank.
//
// Every MPI call runs on one communication thread that this object starts (and that initialises
// MPI, so MPI_THREAD_FUNNELED is all the library must provide): the started operations progress
// there while the calling thread computes, which Debian's OpenMPI, built without an asynchronous
// progress thread, would otherwise do only inside MPI calls. The thread waits for an operation by
// testing it, spinning briefly, then sleeping between tests, so that a rank with one compute
// thread per core does not lose a core to the wait.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "hyla/model/collective.h"

namespace hyla {

class MpiCollective final : public Collective {
 public:
  MpiCollective();  // MPI_Init_thread, on the communication thread
  ~MpiCollective() override;  // MPI_Finalize there, after every started operation
  MpiCollective(const MpiCollective&) = delete;
  MpiCollective& operator=(const MpiCollective&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void sum(std::span<float> values) override;
  void sum(std::span<double> values) override;
  void sum(std::span<int64_t> values) override;
  void start_sum(std::span<float> values) override;
  void start_reduce_scatter(std::span<const float> values, std::span<const int> counts, float* mine) override;
  void wait() override;
  void all_gather(std::span<float> values, std::span<const int> counts) override;
  void barrier() override;
  void broadcast(std::string& text) override;
  double busy_seconds() const override { return double(busy_nanoseconds_.load()) * 1e-9; }
  int64_t bytes() const override { return bytes_.load(); }

  // Ends every process of the job (MPI_Abort with `code`): after an error on this one, so that
  // no other waits forever in an operation this one will never join.
  [[noreturn]] void abort(int code);

 private:
  using Job = std::function<void()>;
  void post(Job job);  // runs on the communication thread, after the jobs posted before it
  void run(Job job);   // post, then wait for every posted job
  void serve();
  // Completes one nonblocking MPI operation (an MPI_Request, behind void* to keep mpi.h out of
  // this header), timing it.
  void complete(void* request);

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  int64_t posted_ = 0, finished_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;  // a job's exception, rethrown by the next wait
  std::atomic<int> abort_code_{-1};
  std::atomic<int64_t> busy_nanoseconds_{0}, bytes_{0};
  int rank_ = 0, size_ = 1;
};

}  // namespace hyla
