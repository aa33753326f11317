#include "hyla/kernels/cpu/amx_tiles.h"

#if defined(HYLA_AMX_TILES)

#include <immintrin.h>

namespace hyla::amx {

void zero(int t) {
  switch (t) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    case 3: _tile_zero(3); break;
    case 4: _tile_zero(4); break;
    default: _tile_zero(5); break;
  }
}
void accumulate(int t) {
  switch (t) {
    case 0: _tile_dpbf16ps(0, 6, 7); break;
    case 1: _tile_dpbf16ps(1, 6, 7); break;
    case 2: _tile_dpbf16ps(2, 6, 7); break;
    case 3: _tile_dpbf16ps(3, 6, 7); break;
    case 4: _tile_dpbf16ps(4, 6, 7); break;
    default: _tile_dpbf16ps(5, 6, 7); break;
  }
}
void accumulate_short(int t) {
  switch (t) {
    case 0: _tile_dpbf16ps(0, 4, 5); break;
    case 1: _tile_dpbf16ps(1, 4, 5); break;
    case 2: _tile_dpbf16ps(2, 4, 5); break;
    default: _tile_dpbf16ps(3, 4, 5); break;
  }
}
void store(int t, void* out, int64_t stride) {
  switch (t) {
    case 0: _tile_stored(0, out, stride); break;
    case 1: _tile_stored(1, out, stride); break;
    case 2: _tile_stored(2, out, stride); break;
    case 3: _tile_stored(3, out, stride); break;
    case 4: _tile_stored(4, out, stride); break;
    default: _tile_stored(5, out, stride); break;
  }
}

}  // namespace hyla::amx

#endif
