#pragma once
// The processes of this job. Launched by mpirun (OpenMPI's environment names the rank and size),
// hyla runs on all of them through one MPI collective; started any other way, it is one process
// and never touches MPI. Training reduces through processes() (data parallelism, ZeRO-1); the rest
// of the program may ask rank() whether it is the process that prints and writes.
#include <functional>

#include "hyla/model/collective.h"

namespace hyla {

// From main, before any other thread starts; undone by stop_processes at a normal exit, which
// first runs what at_stop registered (in order).
void start_processes();
void stop_processes();
void at_stop(std::function<void()> last_words);
Collective& processes();
// Whether this process writes the job's logs, metrics and files that one process writes (rank 0).
inline bool leads_processes() { return processes().rank() == 0; }
// How long an exchange of inference across processes may wait for a process that sends nothing
// before the job ends with ProcessFailure naming it (Collective::set_exchange_timeout; `hyla
// --exchange-timeout`, default 60 s; 0: forever).
void set_exchange_timeout(double seconds);
double exchange_timeout();
// After an error: ends every process of the job with `code` when there are several (none may
// wait forever in an operation this one will never join); returns when this is the only one.
void abort_processes(int code);

}  // namespace hyla
