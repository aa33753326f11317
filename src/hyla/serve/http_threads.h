#pragma once
// The HTTP server's threads. cpp-httplib 0.11 gives every accepted connection a thread of its task
// queue until the client goes quiet for the read timeout, so with a fixed pool a few hundred idle
// sockets starve everyone (no credentials or CPU needed). This queue keeps `ready` threads and
// starts one more whenever a connection arrives with none free, up to `limit`; threads beyond
// `ready` exit after a quiet spell. A blocked thread costs stack address space, not CPU.
#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

namespace hyla {

class ElasticThreadPool final : public httplib::TaskQueue {
 public:
  ElasticThreadPool(size_t ready, size_t limit);
  ~ElasticThreadPool() override;
  void enqueue(std::function<void()> job) override;
  void shutdown() override;  // runs the queued jobs, then joins every thread

  size_t threads() const;

 private:
  void work(std::list<std::thread>::iterator self);
  void join_exited(std::unique_lock<std::mutex>& lock);

  const size_t ready_, limit_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;
  std::vector<std::list<std::thread>::iterator> exited_;  // finished threads not yet joined
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace hyla
