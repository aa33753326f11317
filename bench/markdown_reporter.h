#pragma once
// The console reporter of every benchmark program here, which also collects one markdown row per
// run and prints the table at the end: the figures BENCHMARKS.md records. A program says what a
// row holds (and may add counters, e.g. ratios to a reference, to the console line as well).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace hyla::bench {

class MarkdownReporter : public benchmark::ConsoleReporter {
 public:
  // `header`: the table's heading and separator lines, each ending in a newline.
  explicit MarkdownReporter(std::string header) : header_(std::move(header)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> copy = runs;
    for (Run& r : copy) table_ += row(r);
    ConsoleReporter::ReportRuns(copy);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%s%s", header_.c_str(), table_.c_str());
  }

 protected:
  // The markdown row of one run ending in a newline, or "" to leave it out of the table.
  virtual std::string row(Run& run) = 0;
  // The run's name without Google Benchmark's "/min_time:..." suffix.
  static std::string short_name(const Run& run) {
    const std::string name = run.benchmark_name();
    return name.substr(0, name.find("/min_time"));
  }

 private:
  std::string header_, table_;
};

// For programs whose first run per dtype is a large square product (counters "kind": the dtype
// index, 0 or 1, and "is_square"): every run gets `vs_square`, its GFLOP/s over that product's.
class SquareRatioReporter : public MarkdownReporter {
 public:
  using MarkdownReporter::MarkdownReporter;

 protected:
  // Adds `vs_square` (dropping the bookkeeping counters) and returns the run's GFLOP/s.
  double add_vs_square(Run& r) {
    const int kind = int(r.counters["kind"].value);
    const double rate = r.counters["GFLOPs"].value;
    if (r.counters["is_square"].value > 0) square_gflops_[kind] = rate;
    if (square_gflops_[kind] > 0) r.counters["vs_square"] = rate / square_gflops_[kind];
    r.counters.erase("kind");
    r.counters.erase("is_square");
    return rate;
  }

 private:
  double square_gflops_[2] = {0, 0};  // [f32, bf16]
};

}  // namespace hyla::bench
