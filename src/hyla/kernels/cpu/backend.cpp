#include "hyla/kernels/backend.h"

#include <sys/syscall.h>
#include <unistd.h>

#include "hyla/kernels/cpu/instruction_set.h"

namespace hyla {

// The same macros the kernels select their code on (backend.h), so the name cannot claim an
// instruction set the build does not use.
const char* kernel_backend_name() {
  return "cpu ("
#if defined(__AVX512F__)
         "AVX-512"
#if defined(__AVX512BF16__)
         " BF16"
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
         " VNNI"
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
         " AMX"
#endif
#elif defined(__AVX2__) && defined(__FMA__)
         "AVX2"
#else
         "portable"
#endif
         ")";
}

bool native_bf16_products() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

bool amx_tiles() {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM (asm/prctl.h)
  constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
  static const bool granted = syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  return granted;
#else
  return false;
#endif
}

}  // namespace hyla
