#include "hyla/core/threads.h"

#include <omp.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "hyla/core/error.h"
#include "hyla/core/team.h"

namespace hyla {

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  if (cpus.empty())
    for (unsigned cpu = 0; cpu < std::max(1u, std::thread::hardware_concurrency()); ++cpu) cpus.push_back(int(cpu));
  return cpus;
}

int physical_cores() {
  const std::vector<int> cpus = allowed_cpus();
  std::set<std::pair<std::string, std::string>> cores;  // (package, core id)
  for (int cpu : cpus) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(base + "physical_package_id"), core(base + "core_id");
    std::string p, c;
    if (!(package >> p) || !(core >> c)) return int(cpus.size());
    cores.emplace(p, c);
  }
  return cores.empty() ? int(cpus.size()) : int(cores.size());
}

CpuSample sample_cpu_time(const std::vector<int>& cpus) {
  CpuSample s;
  s.at_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  static const double tick = 1.0 / double(sysconf(_SC_CLK_TCK));
  const std::set<int> wanted(cpus.begin(), cpus.end());
  std::ifstream stat("/proc/stat");
  std::string line;
  while (std::getline(stat, line)) {
    // cpuN user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy.
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] == ' ') continue;
    std::istringstream fields(line.substr(3));
    int cpu = -1;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    fields >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (wanted.count(cpu)) s.busy_seconds += (user + nice + system + irq + softirq + steal) * tick;
  }
  rusage own{};
  getrusage(RUSAGE_SELF, &own);
  s.own_seconds = double(own.ru_utime.tv_sec + own.ru_stime.tv_sec) + 1e-6 * double(own.ru_utime.tv_usec + own.ru_stime.tv_usec);
  return s;
}

double cores_busy_elsewhere(const CpuSample& before, const CpuSample& after) {
  const double interval = after.at_seconds - before.at_seconds;
  if (interval <= 0) return 0;
  const double elsewhere = (after.busy_seconds - before.busy_seconds) - (after.own_seconds - before.own_seconds);
  return std::max(0.0, elsewhere / interval);
}

namespace {

thread_local bool t_adaptive = false;

// The load seen by the last samples, shared by every thread that forwards adaptively.
struct LoadMonitor {
  std::mutex mutex;
  std::vector<int> cpus = allowed_cpus();
  CpuSample last = sample_cpu_time(cpus);
  std::atomic<int> busy_elsewhere{0};

  void refresh() {
    std::unique_lock<std::mutex> lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return;
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (now - last.at_seconds < kLoadIntervalSeconds) return;
    const CpuSample sample = sample_cpu_time(cpus);
    busy_elsewhere.store(int(std::floor(cores_busy_elsewhere(last, sample) + 0.5)));
    last = sample;
  }
};

LoadMonitor& load_monitor() {
  static LoadMonitor monitor;
  return monitor;
}

}  // namespace

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

ThreadConfig thread_config_for(int requested) {
  const bool fixed = requested > 0 || (std::getenv("HYLA_THREADS") && *std::getenv("HYLA_THREADS"));
  return {resolve_threads(requested), !fixed};
}

void set_thread_config(const ThreadConfig& config) {
  omp_set_num_threads(config.threads);
  t_adaptive = config.adaptive;
  if (config.adaptive) load_monitor();  // the first sample, so that the first forward has an interval
}

ThreadConfig thread_config() { return {omp_get_max_threads(), t_adaptive}; }

void set_threads(int n) { set_thread_config({n, false}); }

int num_threads() { return detail::current_team() ? detail::current_team_threads() : omp_get_max_threads(); }

int forward_threads() {
  const int configured = omp_get_max_threads();
  if (!t_adaptive) return configured;
  LoadMonitor& monitor = load_monitor();
  monitor.refresh();
  return std::clamp(configured - monitor.busy_elsewhere.load(), 1, configured);
}

void run_on_passing_thread(const std::function<void()>& fn) {
  const ThreadConfig config = thread_config();
  std::exception_ptr error;
  std::thread([&] {
    set_thread_config(config);
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
}

}  // namespace hyla
