#pragma once
// Inside ggml_gemm.cpp: dot products of one row of ggml blocks with one row of x, decoding each
// block in registers (no unpacked copy), for the types whose decode is the products' cost in
// (the K types, IQ2_XXS, IQ1_S, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0). x is rounded per block of the type
// (256 or 32 values; xscale16 repeats a block's scale over its groups of 16; xsum16 is Σ q_x per
// group); `blocks` counts the type's blocks. The integer sums are exact; each block adds its integer total times
// d · s_x in f32 (and its offsets' total times dmin · s_x), so the kernels agree with
// ggml_gemm.cpp's unpacked path to f32 rounding.
#include <cstdint>

#include "hyla/io/ggml_types.h"

namespace hyla::ggml_fused {

using DotFn = float (*)(const uint8_t* row, const int8_t* xq, const float* xscale16, const int32_t* xsum16,
                        int64_t blocks);

// The fused kernel of `type` where this build has one (AVX-512 VNNI), else null.
DotFn dot_for(GgmlType type);

}  // namespace hyla::ggml_fused
