#include "hyla/core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

namespace hyla {

namespace {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  const auto s = int64_t(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

}  // namespace

std::string format_amount(double amount, const std::string& unit) {
  const bool bytes = unit == "B";
  const char* prefixes[] = {"", "k", "M", "G", "T"};
  const char* byte_units[] = {"B", "KB", "MB", "GB", "TB"};
  const double base = bytes ? 1024.0 : 1000.0;
  int p = 0;
  while (amount >= base && p < 4) amount /= base, ++p;
  const int decimals = p == 0 ? 0 : bytes ? 1 : 2;
  if (bytes) return fmt::format("{:.{}f} {}", amount, decimals, byte_units[p]);
  return fmt::format("{:.{}f}{} {}", amount, decimals, prefixes[p], unit);
}

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      terminal_(::isatty(STDERR_FILENO) == 1),
      exceptions_at_start_(std::uncaught_exceptions()),
      start_(Clock::now()),
      // A terminal bar is redrawn often; a log gets a line every ten seconds so it stays readable.
      interval_ns_(terminal_ ? 100'000'000 : 10'000'000'000) {
  next_draw_ns_ = interval_ns_;
}

Progress::~Progress() {
  if (std::uncaught_exceptions() == exceptions_at_start_) finish();
  else if (terminal_ && !finished_) fmt::print(stderr, "\n");  // leave the bar for the error line below
}

void Progress::advance(uint64_t amount) {
  const uint64_t done = done_.fetch_add(amount, std::memory_order_relaxed) + amount;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  int64_t due = next_draw_ns_.load(std::memory_order_relaxed);
  if (now < due) return;
  // Only the thread that moves the deadline draws, so lines never interleave.
  if (next_draw_ns_.compare_exchange_strong(due, now + interval_ns_)) draw(done, false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(done(), true);
}

void Progress::draw(uint64_t done, bool final) {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = seconds > 0 ? double(done) / seconds : 0.0;
  std::string line = label_;
  if (total_ > 0) {
    const double fraction = std::min(1.0, double(done) / double(total_));
    if (terminal_) {
      constexpr int kWidth = 30;
      const int filled = int(fraction * kWidth);
      line += " [" + std::string(size_t(filled), '#') + std::string(size_t(kWidth - filled), '-') + "]";
    }
    line += fmt::format(" {:5.1f}%", 100.0 * fraction);
  }
  line += fmt::format("  {}  {}/s", format_amount(double(done), unit_), format_amount(rate, unit_));
  if (final) line += fmt::format("  {} elapsed", format_duration(seconds));
  else if (total_ > 0 && rate > 0) line += fmt::format("  ETA {}", format_duration(double(total_ - std::min(done, total_)) / rate));
  if (terminal_) fmt::print(stderr, "\r\033[K{}{}", line, final ? "\n" : "");
  else fmt::print(stderr, "{}\n", line);
  std::fflush(stderr);
}

}  // namespace hyla
