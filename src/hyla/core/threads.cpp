#include "hyla/core/threads.h"

#include <omp.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "hyla/core/error.h"

namespace hyla {

int physical_cores() {
  std::set<std::pair<std::string, std::string>> cores;  // (package, core id)
  const unsigned logical = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned cpu = 0; cpu < logical; ++cpu) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(base + "physical_package_id"), core(base + "core_id");
    std::string p, c;
    if (!(package >> p) || !(core >> c)) return int(logical);
    cores.emplace(p, c);
  }
  return cores.empty() ? int(logical) : int(cores.size());
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  if (const char* env = std::getenv("HYLA_THREADS"); env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    HYLA_CHECK(*end == '\0' && n > 0 && n <= 4096, "HYLA_THREADS must be a positive integer, got '{}'", env);
    return int(n);
  }
  return physical_cores();
}

void set_threads(int n) { omp_set_num_threads(n); }

int num_threads() { return omp_get_max_threads(); }

void run_on_passing_thread(const std::function<void()>& fn) {
  const int threads = num_threads();
  std::exception_ptr error;
  std::thread([&] {
    set_threads(threads);
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
}

}  // namespace hyla
