#include "hyla/core/team.h"

#include <linux/futex.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <memory>
#include <mutex>

#include "hyla/core/error.h"

namespace hyla {
namespace {

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or the budget is spent; returns done().
template <typename Done>
bool spin_until(Done&& done) {
  const int64_t deadline = now_ns() + Team::kSpinBudgetNanoseconds;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (now_ns() > deadline) return done();
  }
}

thread_local Team* t_team = nullptr;
thread_local int t_team_threads = 1;
thread_local int t_piece_depth = 0;
thread_local int t_piece_thread = 0;

std::mutex g_team_mutex;  // guards g_team's creation and its one user
std::unique_ptr<Team> g_team;
bool g_team_in_use = false;

}  // namespace

Team::Team(int threads) : shares_(size_t(std::max(threads, 1))) {
  HYLA_ASSERT(threads >= 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work_loop(i); });
}

Team::~Team() {
  stop_.store(true);
  epoch_.fetch_add(2);
  futex_wake_all(epoch_);
  for (std::thread& w : workers_) w.join();
}

void Team::claim_from(int share, int thread) {
  Share& s = shares_[size_t(share)];
  for (;;) {
    const int64_t begin = s.next.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= s.end) return;
    trampoline_(body_, thread, begin, std::min(s.end, begin + grain_));
  }
}

void Team::claim_pieces(int thread) {
  claim_from(thread, thread);
  for (int i = 1; i < allowed_; ++i) claim_from((thread + i) % allowed_, thread);
}

void Team::run_job(int64_t n, int64_t grain, int threads, void* body, Trampoline trampoline) {
  // The epoch is closed and no worker is active: the job's fields are the caller's to write.
  body_ = body, trampoline_ = trampoline, grain_ = grain;
  allowed_ = std::clamp(threads, 1, size());
  if (allowed_ == 1) return trampoline(body, 0, 0, n);  // the workers stay asleep
  // Whole pieces to each thread, the first shares one piece longer when they do not divide evenly.
  const int64_t pieces = (n + grain - 1) / grain;
  int64_t first = 0;
  for (int t = 0; t < allowed_; ++t) {
    shares_[size_t(t)].next.store(std::min(n, first * grain), std::memory_order_relaxed);
    first += pieces / allowed_ + (t < pieces % allowed_ ? 1 : 0);
    shares_[size_t(t)].end = std::min(n, first * grain);
  }
  const uint32_t open = epoch_.load(std::memory_order_relaxed) + 1;
  epoch_.store(open);  // seq_cst: the workers' load of sleepers_ pairs with this
  if (sleepers_.load() > 0) futex_wake_all(epoch_);
  claim_pieces(0);
  // Every piece is claimed; close the job and wait for the workers inside it to finish theirs. A
  // worker that joins after the close sees it and leaves without touching the job.
  epoch_.store(open + 1);
  if (active_.load() == 0) return;
  if (spin_until([&] { return active_.load(std::memory_order_acquire) == 0; })) return;
  caller_asleep_.store(1);
  for (uint32_t a = active_.load(); a != 0; a = active_.load()) futex_wait(active_, a);
  caller_asleep_.store(0);
}

void Team::work_loop(int index) {
  omp_set_num_threads(1);  // an OpenMP region entered from a piece runs on this thread
  // (and a parallel_for inside a piece runs inline: PieceScope)
  // The epoch the constructor left, not a load: the destructor may have moved on before this
  // thread first ran.
  uint32_t seen = kFirstEpoch;
  for (;;) {
    const auto changed = [&] { return epoch_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(changed)) {
      sleepers_.fetch_add(1);
      while (epoch_.load() == seen) futex_wait(epoch_, seen);
      sleepers_.fetch_sub(1);
    }
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    if (seen % 2 != 0) continue;  // closed before this worker saw it open
    active_.fetch_add(1);
    // Joined only if the job is still open: the caller closes before it checks active_.
    if (epoch_.load() == seen && index < allowed_) claim_pieces(index);
    if (active_.fetch_sub(1) == 1 && caller_asleep_.load()) futex_wake_all(active_);
  }
}

ForwardThreadsScope::ForwardThreadsScope(int threads, bool decode_team) : omp_threads_(omp_get_max_threads()) {
  if (decode_team && threads > 1 && !t_team) {
    std::lock_guard<std::mutex> lock(g_team_mutex);
    if (!g_team_in_use) {
      if (!g_team || g_team->size() < threads) {
        g_team.reset();
        g_team = std::make_unique<Team>(threads);
      }
      g_team_in_use = owns_team_ = true;
      t_team = g_team.get();
      t_team_threads = threads;
    }
  }
  omp_set_num_threads(owns_team_ ? 1 : std::max(1, threads));
}

ForwardThreadsScope::~ForwardThreadsScope() {
  omp_set_num_threads(omp_threads_);
  if (!owns_team_) return;
  t_team = nullptr;
  t_team_threads = 1;
  std::lock_guard<std::mutex> lock(g_team_mutex);
  g_team_in_use = false;
}

namespace detail {

Team* current_team() { return t_team; }
int current_team_threads() { return t_team_threads; }
bool inside_piece() { return t_piece_depth > 0; }
int piece_thread() { return t_piece_thread; }
PieceScope::PieceScope(int thread) : outer_thread_(t_piece_thread) {
  ++t_piece_depth;
  t_piece_thread = thread;
}
PieceScope::~PieceScope() {
  --t_piece_depth;
  t_piece_thread = outer_thread_;
}

void openmp_parallel_for(int64_t n, int64_t grain, void* body, void (*trampoline)(void*, int, int64_t, int64_t)) {
  const int64_t pieces = (n + grain - 1) / grain;
  const int64_t threads = std::min<int64_t>(omp_in_parallel() ? 1 : omp_get_max_threads(), pieces);
  if (threads <= 1) {
    const int thread = omp_get_thread_num();  // inside an OpenMP region, that thread's index
    const PieceScope piece(thread);
    return trampoline(body, thread, 0, n);
  }
#pragma omp parallel num_threads(int(threads))
  {
    const int thread = omp_get_thread_num();
    const PieceScope piece(thread);
#pragma omp for schedule(dynamic, 1)
    for (int64_t p = 0; p < pieces; ++p) trampoline(body, thread, p * grain, std::min(n, (p + 1) * grain));
  }
}

void openmp_static_rows(int64_t rows, void* body, void (*trampoline)(void*, int64_t, int64_t)) {
  const int threads = omp_in_parallel() ? 1 : int(std::min<int64_t>(omp_get_max_threads(), rows));
  if (threads <= 1) return trampoline(body, 0, rows);
#pragma omp parallel num_threads(threads)
  {
    const int thread = omp_get_thread_num();
    const PieceScope piece(thread);
    const int64_t begin = rows * thread / threads, end = rows * (thread + 1) / threads;
    trampoline(body, begin, end);
  }
}

}  // namespace detail
}  // namespace hyla
