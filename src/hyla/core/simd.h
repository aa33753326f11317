#pragma once
// x86 intrinsics. GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 headers (their
// _mm512_undefined_* placeholders); the pragma silences it for those header lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
