// The exchanges of `hyla plan --hosts` measured between this machine's processes (issue 68's check
// of the model's network terms, docs/distributed.md): under `mpirun -np N`, the time of an f32
// all-reduce (Collective::sum) and an all-gather per message size, from 16 B to 64 MiB, each the
// mean of enough repetitions to fill --seconds. Rank 0 prints a Markdown table and the latency and
// bandwidth that `--network GBPS,LATENCY_US` would need to reproduce the smallest and the largest.
//   mpirun -np 2 build/bench_exchange [--seconds 0.2]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#if HYLA_MPI
#include "hyla/dist/mpi_collective.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  double budget = 0.2;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--seconds") == 0) budget = std::stod(argv[i + 1]);
#if !HYLA_MPI
  fmt::print(stderr, "bench_exchange: this build has no MPI (HYLA_MPI=OFF)\n");
  return 1;
#else
  hyla::MpiCollective world;
  const int n = world.size();
  if (world.rank() == 0)
    fmt::print("{} processes; mean of repeated operations filling {} s each\n\n"
               "| message | all-reduce | all-reduce bus bandwidth | all-gather | all-gather bus bandwidth |\n"
               "|---:|---:|---:|---:|---:|\n", n, budget);
  double first_reduce = 0, last_bandwidth = 0;
  for (size_t bytes = 16; bytes <= (size_t(64) << 20); bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> values(count, 1.0f);
    std::vector<int> counts(size_t(n), int(count / size_t(n)));
    counts.back() += int(count % size_t(n));
    // Every rank runs the same number of repetitions: rank 0 decides from a timed probe.
    const auto time = [&](auto&& operation) {
      world.barrier();
      auto start = Clock::now();
      operation();
      std::vector<double> probe = {std::chrono::duration<double>(Clock::now() - start).count()};
      world.sum(std::span<double>(probe));
      const int64_t reps = std::clamp<int64_t>(int64_t(budget / std::max(probe[0] / n, 1e-7)), 3, 100000);
      world.barrier();
      start = Clock::now();
      for (int64_t r = 0; r < reps; ++r) operation();
      std::vector<double> took = {std::chrono::duration<double>(Clock::now() - start).count()};
      world.sum(std::span<double>(took));
      return took[0] / n / double(reps);
    };
    const double reduce = time([&] { world.sum(std::span<float>(values)); });
    const double gather = time([&] { world.all_gather(std::span<float>(values), counts); });
    // Bus bandwidth (NCCL's convention): what each process's link carries, 2(N-1)/N of the
    // message for an all-reduce, (N-1)/N for an all-gather, over the time.
    const double spread = double(n - 1) / n;
    const double reduce_bw = 2 * spread * double(bytes) / reduce, gather_bw = spread * double(bytes) / gather;
    if (bytes == 16) first_reduce = reduce;
    last_bandwidth = reduce_bw;
    if (world.rank() == 0)
      fmt::print("| {} B | {:.2f} us | {:.2f} GB/s | {:.2f} us | {:.2f} GB/s |\n", bytes, reduce * 1e6, reduce_bw / 1e9,
                 gather * 1e6, gather_bw / 1e9);
  }
  if (world.rank() == 0)
    fmt::print("\n--network {:.2f},{:.2f}: the largest all-reduce's bus bandwidth and the smallest one's time\n",
               last_bandwidth / 1e9, first_reduce * 1e6);
  return 0;
#endif
}
