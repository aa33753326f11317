#pragma once
// A progress report on stderr for long jobs (tokenising, training, evaluating): a redrawn bar with
// percent, rate and ETA when stderr is a terminal, plain periodic lines otherwise (logs, CI).
// advance() may be called from several threads at once.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace hyla {

class Progress {
 public:
  // `total` 0 means unknown (no percent or ETA). `unit` names what is counted; "B" is shown as
  // KB/MB/GB, anything else with k/M/G suffixes.
  Progress(std::string label, uint64_t total, std::string unit = "B");
  ~Progress();  // finishes the report if finish() was not called and no exception is unwinding
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t amount);
  void finish();  // draws the final state and ends the line

  uint64_t done() const { return done_.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  void draw(uint64_t done, bool final);

  std::string label_, unit_;
  uint64_t total_;
  bool terminal_, finished_ = false;
  int exceptions_at_start_;
  Clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> next_draw_ns_{0};  // since start_; the thread that claims it draws
  int64_t interval_ns_;
};

// "12.3 MB" for bytes, "4.56M" for other units.
std::string format_amount(double amount, const std::string& unit);

}  // namespace hyla
