#pragma once
// x86 intrinsics. GCC 12 reports -W(maybe-)uninitialized inside its own AVX-512 headers (their
// _mm512_undefined_* placeholders); the pragma silences it for those header lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
