#include "hyla/serve/http_threads.h"

#include <chrono>

namespace hyla {

namespace {
constexpr auto kQuietSpell = std::chrono::seconds(30);  // an extra thread idle this long exits
}

ElasticThreadPool::ElasticThreadPool(size_t ready, size_t limit) : ready_(ready), limit_(std::max(ready, limit)) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < ready_; ++i) {
    threads_.emplace_front();
    threads_.front() = std::thread(&ElasticThreadPool::work, this, threads_.begin());
  }
}

ElasticThreadPool::~ElasticThreadPool() { shutdown(); }

void ElasticThreadPool::enqueue(std::function<void()> job) {
  std::unique_lock<std::mutex> lock(mutex_);
  join_exited(lock);
  jobs_.push_back(std::move(job));
  if (jobs_.size() > idle_ && threads_.size() - exited_.size() < limit_) {
    threads_.emplace_front();
    threads_.front() = std::thread(&ElasticThreadPool::work, this, threads_.begin());
  }
  wake_.notify_one();
}

void ElasticThreadPool::shutdown() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
  std::list<std::thread> all;
  all.swap(threads_);
  exited_.clear();
  lock.unlock();
  for (std::thread& t : all)
    if (t.joinable()) t.join();
}

size_t ElasticThreadPool::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return threads_.size() - exited_.size();
}

void ElasticThreadPool::join_exited(std::unique_lock<std::mutex>& lock) {
  if (exited_.empty()) return;
  std::list<std::thread> done;
  for (auto it : exited_) done.splice(done.end(), threads_, it);
  exited_.clear();
  lock.unlock();
  for (std::thread& t : done) t.join();  // each has left work(): the join is immediate
  lock.lock();
}

void ElasticThreadPool::work(std::list<std::thread>::iterator self) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    const bool woken = wake_.wait_for(lock, kQuietSpell, [&] { return stopping_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty()) {
      if (stopping_) return;
      if (!woken && threads_.size() - exited_.size() > ready_) {
        exited_.push_back(self);
        return;
      }
      continue;
    }
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

}  // namespace hyla
