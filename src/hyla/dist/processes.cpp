#include "hyla/dist/processes.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "hyla/core/error.h"
#if HYLA_MPI
#include "hyla/dist/mpi_collective.h"
#endif

namespace hyla {
namespace {

#if HYLA_MPI
std::unique_ptr<MpiCollective> mpi;
#endif
std::vector<std::function<void()>> last_words_at_stop;
double exchange_timeout_seconds = 60;

// OpenMPI's launcher (mpirun, or a PMIx-aware resource manager) names every process's rank.
bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_RANK") || std::getenv("PMIX_RANK"); }

}  // namespace

void start_processes() {
  if (!launched_by_mpirun()) return;
#if HYLA_MPI
  mpi = std::make_unique<MpiCollective>();
#else
  fail("this hyla was built without MPI (cmake -DHYLA_MPI=OFF) and cannot run under mpirun; rebuild with MPI");
#endif
}

void at_stop(std::function<void()> last_words) { last_words_at_stop.push_back(std::move(last_words)); }

void stop_processes() {
  for (const auto& words : last_words_at_stop) words();
  last_words_at_stop.clear();
#if HYLA_MPI
  mpi.reset();
#endif
}

void set_exchange_timeout(double seconds) {
  HYLA_CHECK(seconds >= 0 && std::isfinite(seconds), "--exchange-timeout {}: must be >= 0 seconds", seconds);
  exchange_timeout_seconds = seconds;
}

double exchange_timeout() { return exchange_timeout_seconds; }

Collective& processes() {
#if HYLA_MPI
  if (mpi) return *mpi;
#endif
  return single_process();
}

void abort_processes(int code) {
#if HYLA_MPI
  if (mpi && mpi->size() > 1) mpi->abort(code);
#endif
}

}  // namespace hyla
