#pragma once

namespace hyla {

// Physical cores of this machine (hyperthread siblings counted once).
int physical_cores();
// The thread count to use: `requested` if > 0, else $HYLA_THREADS if set, else physical cores.
int resolve_threads(int requested);
// Sets the OpenMP thread count used by hyla's kernels and by oneDNN.
void set_threads(int n);
int num_threads();

}  // namespace hyla
