#pragma once
// The decode thread team: persistent workers that a decoding forward hands its products to.
//
// Why not OpenMP for decode: a decoded token crosses hundreds of small parallel regions, and
// libgomp's waits spin for a fixed count (~300,000 pauses, milliseconds on these machines) before
// they sleep. A worker that the kernel deschedules (another process wants the core) makes every
// region wait for it, and the waiting thread spins on the core that other process needs: with one
// CPU-bound process beside it, decode at 2 threads ran 4x slower than at one. This team waits by
// spinning for a budget measured in time (kSpinBudget) and then sleeping on a futex, and its work
// is claimed piece by piece, so a worker that has not arrived yet costs nothing: whoever is
// running takes its pieces. Only a worker descheduled while it holds a piece is waited for. Each
// thread first claims pieces from its own share of the job (a counter in its own cache line), then
// from the others' (stealing): one shared counter bounced between the cores at every claim, ~80
// ns a piece here, a tenth of a decode product's time at eight pieces.
//
// What crosses it: a body called as body(thread, begin, end) over pieces of [0, n), thread 0
// being the caller. The body must not fork again (a parallel_for inside a piece runs inline) and
// must not wait for another piece (there is no barrier inside a job: two phases are two jobs),
// and must not throw: kernel code never does, and as from an OpenMP region an exception escaping
// a worker's piece ends the process.
#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

#include "hyla/core/threads.h"

namespace hyla {

class Team {
 public:
  // A team of `threads` threads: the caller of run() and threads - 1 workers started here.
  explicit Team(int threads);
  ~Team();
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Runs body over [0, n) in pieces of `grain` items, using at most `threads` threads (the caller
  // included), and returns when every piece has run. Not reentrant: one caller at a time.
  template <typename Body>
  void run(int64_t n, int64_t grain, int threads, Body&& body) {
    run_job(n, grain, threads, &body, [](void* b, int thread, int64_t begin, int64_t end) {
      (*static_cast<Body*>(b))(thread, begin, end);
    });
  }

  // How long a waiting thread spins before it sleeps: longer than the gaps between a token's
  // products (microseconds), far shorter than a scheduler's time slice (milliseconds). Budgets
  // from 0 to 2 ms decoded alike here within this VM's noise (BENCHMARKS.md); a descheduled
  // partner costs nothing either way, since pieces are claimed, not assigned.
  static constexpr int64_t kSpinBudgetNanoseconds = 50'000;

 private:
  using Trampoline = void (*)(void*, int, int64_t, int64_t);
  void run_job(int64_t n, int64_t grain, int threads, void* body, Trampoline trampoline);
  void work_loop(int index);
  void claim_pieces(int thread);
  void claim_from(int share, int thread);  // runs pieces of `share`'s range until it is empty

  // The job, written by the caller while the epoch is closed (odd) and no worker is active.
  void* body_ = nullptr;
  Trampoline trampoline_ = nullptr;
  int64_t grain_ = 0;
  int allowed_ = 1;  // threads the job may use: workers with index ≥ allowed_ stay out

  static constexpr uint32_t kFirstEpoch = 1;
  alignas(64) std::atomic<uint32_t> epoch_{kFirstEpoch};  // even: a job is open; odd: closed
  // Each thread's share of the job's pieces: the next item to claim, and where the share ends.
  struct alignas(64) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::vector<Share> shares_;  // one per thread, the caller's first
  alignas(64) std::atomic<uint32_t> active_{0};    // workers inside the open job
  alignas(64) std::atomic<uint32_t> sleepers_{0};  // workers asleep on epoch_
  std::atomic<uint32_t> caller_asleep_{0};         // the caller asleep on active_
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

// Runs body(thread, begin, end) over [0, n) in pieces of at least `grain` items (the last may be
// shorter), each piece taken by whichever thread is free, with the threads this thread's forward
// may use: on the decode team while a ForwardThreadsScope holds it for this thread, else on
// OpenMP threads. Inside a piece (or an OpenMP region), a parallel_for runs inline, as one piece
// with the enclosing piece's thread index. The one place
// kernels on the decode path fork.
template <typename Body>
void parallel_for(int64_t n, int64_t grain, Body&& body);

// Runs body(begin, end) over [0, rows) where a row costs about `row_work` simple element
// operations: on this thread alone unless worth_parallel(rows × row_work), else on the decode
// team in pieces of at least kParallelGrain operations, or on OpenMP's threads in one block
// each. How a loop over rows forks. Not `#pragma omp parallel for if (...)`: libgomp enters a
// region even when the clause keeps it on one thread, ~1.2 µs each on the Zen 5 box, and a
// decoded token crossed ~140-180 such loops (about a tenth of its time), all of it serial.
template <typename Body>
void parallel_rows(int64_t rows, int64_t row_work, Body&& body);

// The threads of one forward on this thread, until the scope ends. With `decode_team`,
// parallel_for hands its work to the process's decode team (`threads` of its threads) and OpenMP
// regions entered meanwhile run on this thread alone, so libgomp's workers sleep instead of
// spinning beside the team's; a second thread asking while the team is in use, or one thread,
// gets OpenMP. Otherwise OpenMP runs `threads` threads.
class ForwardThreadsScope {
 public:
  ForwardThreadsScope(int threads, bool decode_team);
  ~ForwardThreadsScope();
  ForwardThreadsScope(const ForwardThreadsScope&) = delete;
  ForwardThreadsScope& operator=(const ForwardThreadsScope&) = delete;

 private:
  bool owns_team_ = false;
  int omp_threads_ = 1;
};

namespace detail {
Team* current_team();   // the team this thread's open scope holds, else nullptr
int current_team_threads();
bool inside_piece();    // whether this thread is running a piece of parallel_for
int piece_thread();     // the thread index of the piece it runs (0 outside pieces)
void openmp_parallel_for(int64_t n, int64_t grain, void* body, void (*trampoline)(void*, int, int64_t, int64_t));
// Rows [0, rows) in one block per OpenMP thread, the t-th block to thread t, as
// `schedule(static)` splits them: a training step's loops over the same rows then find them in
// the cache of the core that wrote them. Inline inside an OpenMP region.
void openmp_static_rows(int64_t rows, void* body, void (*trampoline)(void*, int64_t, int64_t));
class PieceScope {
 public:
  explicit PieceScope(int thread);
  ~PieceScope();

 private:
  int outer_thread_;
};
}  // namespace detail

template <typename Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  if (n <= 0) return;
  grain = grain < 1 ? 1 : grain;
  if (detail::inside_piece() || n <= grain) {
    body(detail::piece_thread(), int64_t(0), n);
    return;
  }
  auto trampoline = [](void* b, int thread, int64_t begin, int64_t end) {
    (*static_cast<std::remove_reference_t<Body>*>(b))(thread, begin, end);
  };
  if (Team* team = detail::current_team())
    team->run(n, grain, detail::current_team_threads(), [&](int thread, int64_t begin, int64_t end) {
      const detail::PieceScope piece(thread);
      body(thread, begin, end);
    });
  else
    detail::openmp_parallel_for(n, grain, &body, trampoline);
}

template <typename Body>
void parallel_rows(int64_t rows, int64_t row_work, Body&& body) {
  if (rows <= 0) return;
  row_work = row_work < 1 ? 1 : row_work;
  if (!worth_parallel(rows * row_work) || detail::inside_piece()) return body(int64_t(0), rows);
  if (detail::current_team()) {
    parallel_for(rows, (kParallelGrain + row_work - 1) / row_work,
                 [&](int, int64_t begin, int64_t end) { body(begin, end); });
    return;
  }
  detail::openmp_static_rows(rows, &body, [](void* b, int64_t begin, int64_t end) {
    (*static_cast<std::remove_reference_t<Body>*>(b))(begin, end);
  });
}

}  // namespace hyla
