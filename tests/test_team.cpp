#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <thread>
#include <vector>

#include "hyla/core/team.h"
#include "hyla/core/threads.h"

namespace hyla {
namespace {

// Every item of every job runs exactly once, on a thread index inside the team, and the caller
// sees all of a job's writes when run() returns; a nested parallel_for runs inline.
TEST(Team, EveryItemRunsOnceAndTheCallerSeesItsWrites) {
  Team team(3);
  std::vector<int> hits(1000);
  for (int job = 0; job < 2000; ++job) {
    const int64_t n = 1 + job % 997;
    const int threads = 1 + job % 3;
    std::atomic<int> bad_thread{0};
    team.run(n, 1 + job % 7, threads, [&](int thread, int64_t begin, int64_t end) {
      if (thread < 0 || thread >= threads) bad_thread.fetch_add(1);
      for (int64_t i = begin; i < end; ++i) hits[size_t(i)] += 1;
    });
    ASSERT_EQ(bad_thread.load(), 0) << "job " << job;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "job " << job << " item " << i;
    std::fill(hits.begin(), hits.end(), 0);
  }
}

TEST(Team, ParallelForUsesTheTeamOnlyInsideItsScopeAndNestsInline) {
  std::vector<std::atomic<int>> hits(4096);
  std::atomic<int> nested_outer_pieces{0};
  {
    const ForwardThreadsScope scope(2, /*decode_team=*/true);
    EXPECT_EQ(num_threads(), 2);
    parallel_for(64, 1, [&](int outer_thread, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        parallel_for(64, 1, [&, i](int thread, int64_t b, int64_t e) {
          EXPECT_EQ(thread, outer_thread);  // inline: one piece, the whole range, the same thread
          EXPECT_EQ(b, 0);
          EXPECT_EQ(e, 64);
          for (int64_t j = b; j < e; ++j) hits[size_t(i * 64 + j)].fetch_add(1);
        });
      nested_outer_pieces.fetch_add(1);
    });
  }
  for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
  EXPECT_GE(nested_outer_pieces.load(), 1);
  // Outside the scope: OpenMP threads, and the count is the configured one again.
  const int before = num_threads();
  {
    const ForwardThreadsScope scope(1, /*decode_team=*/false);
    EXPECT_EQ(num_threads(), 1);
  }
  EXPECT_EQ(num_threads(), before);
}

// A second thread asking for the team while it is in use gets OpenMP, and both finish.
// Below kParallelGrain operations a row loop runs as one call on this thread, outside any OpenMP
// region (libgomp's region costs ~1.2 µs even on one thread); above it, in pieces that cover
// every row once, each worth at least kParallelGrain operations but the last.
TEST(Team, ParallelRowsForksOnlyWhenTheWorkIsWorthIt) {
  for (const bool decode_team : {false, true}) {
    const ForwardThreadsScope scope(2, decode_team);
    int calls = 0;
    parallel_rows(31, 512, [&](int64_t begin, int64_t end) {
      ++calls;
      EXPECT_EQ(begin, 0);
      EXPECT_EQ(end, 31);
      EXPECT_FALSE(omp_in_parallel());
    });
    EXPECT_EQ(calls, 1);
    parallel_rows(0, 512, [&](int64_t, int64_t) { ++calls; });
    EXPECT_EQ(calls, 1);
    for (const int64_t row_work : {int64_t(1), int64_t(512), int64_t(3000), kParallelGrain * 2}) {
      const int64_t rows = 4 * kParallelGrain / row_work + 5;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(rows));
      std::atomic<int> short_pieces{0};
      parallel_rows(rows, row_work, [&](int64_t begin, int64_t end) {
        if ((end - begin) * row_work < kParallelGrain && end != rows) short_pieces.fetch_add(1);
        for (int64_t r = begin; r < end; ++r) hits[size_t(r)].fetch_add(1);
      });
      EXPECT_EQ(short_pieces.load(), 0) << "row_work " << row_work;
      for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(hits[size_t(r)].load(), 1) << "row_work " << row_work << " row " << r;
    }
  }
}

TEST(Team, ASecondUserFallsBackToOpenMp) {
  std::atomic<int64_t> total{0};
  const auto work = [&] {
    for (int rep = 0; rep < 200; ++rep) {
      const ForwardThreadsScope scope(2, /*decode_team=*/true);
      parallel_for(1000, 10, [&](int, int64_t begin, int64_t end) { total.fetch_add(end - begin); });
    }
  };
  std::thread other(work);
  work();
  other.join();
  EXPECT_EQ(total.load(), 2 * 200 * 1000);
}

// A team destroyed before its workers first ran (the process exiting right after a forward)
// still joins them.
TEST(Team, DestroyedRightAfterItStarts) {
  for (int i = 0; i < 50; ++i) Team team(2);
}

TEST(Threads, BusyCoresElsewhereExcludeThisProcess) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  const CpuSample before = sample_cpu_time(cpus);
  // This process keeps one core busy for 0.3 s of its own CPU time (however long other tests
  // make that take): none of it counts as elsewhere.
  double sink = 0;
  for (CpuSample now = before; now.own_seconds - before.own_seconds < 0.3 && now.at_seconds - before.at_seconds < 10;
       now = sample_cpu_time(cpus))
    for (int i = 0; i < 100000; ++i) sink += double(i) * 1e-9;
  const CpuSample after = sample_cpu_time(cpus);
  const double own = after.own_seconds - before.own_seconds, interval = after.at_seconds - before.at_seconds;
  EXPECT_GT(own, 0.15) << sink;
  // The box's busy time includes this process's (to the 10 ms ticks of /proc/stat), and what is
  // left is at most the other cores (other tests may keep them busy).
  EXPECT_GE(after.busy_seconds - before.busy_seconds, own - 0.05);
  EXPECT_LE(cores_busy_elsewhere(before, after), double(cpus.size()) - own / interval + 0.2);
  // Arithmetic: 1.5 busy seconds over 1 s, 0.5 of them this process's: one core elsewhere.
  EXPECT_DOUBLE_EQ(cores_busy_elsewhere({0, 0, 0}, {1.5, 0.5, 1.0}), 1.0);
  EXPECT_GE(physical_cores(), 1);
  EXPECT_LE(physical_cores(), int(cpus.size()));
}

TEST(Threads, AdaptiveConfigurationNeverGoesBelowOneOrAboveTheCount) {
  const ThreadConfig before = thread_config();
  set_thread_config({2, true});
  const int threads = forward_threads();
  EXPECT_GE(threads, 1);
  EXPECT_LE(threads, 2);
  EXPECT_TRUE(thread_config().adaptive);
  set_threads(3);
  EXPECT_EQ(forward_threads(), 3);
  EXPECT_FALSE(thread_config().adaptive);
  set_thread_config(before);
}

}  // namespace
}  // namespace hyla
