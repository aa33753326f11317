#pragma once
// Matrix products straight from ggml's quantised blocks (the K, IQ, TQ and legacy types of a GGUF
// file, io/ggml_types.h): y = x · Wᵀ + beta·y, W [rows, cols] as the file stores it, rows of
// blocks one after another, read where it lies (a memory map) with no copy or repacking.
//
// Each row is unpacked a chunk of columns at a time into a small buffer on the stack, in
// ggml_unpack's form (value = scale · q − min per group of 16, q an int8), and x is rounded to
// 8 bits per group of 16 (int8_gemm.h's activation rounding with block 16: s_x = max|x| / 127,
// q_x to nearest even). A group then adds s_x · (scale · Σ q·q_x − min · Σ q_x): the integer sums
// exact, the groups summed in f32. ggml rounds x per 256 values for these types (Q8_K) and per 32
// for the others; per 16 keeps more of x at the same cost.
//
// Kernels: AVX-512 VNNI (64 values per vpdpbusd on |q| and q_x carrying q's sign), AVX2 (vpmaddubsw
// on the same bytes) and portable integer code. They sum in different orders, so they agree to
// f32 rounding, not bit for bit; each is checked against a double-precision product.
#include <cstdint>
#include <span>

#include "hyla/io/ggml_types.h"

namespace hyla {

// A matrix of a quantised ggml type (ggml_type_quantized), cols a multiple of its block.
struct GgmlMatrix {
  const uint8_t* data = nullptr;
  GgmlType type = GgmlType::Q8_0;
  int64_t rows = 0, cols = 0;
  uint64_t row_bytes() const { return ggml_bytes(type, cols); }
};

enum class GgmlKernel : uint8_t { Native, Avx2, Portable };
bool ggml_kernel_available(GgmlKernel kernel);

// The workspace ggml_matmul_rows takes (threads = 1) and ggml_matmul (threads = num_threads() of
// the calling thread): x's rounded rows, and for prefill-sized x (16 rows or more) each thread's
// space to unpack and pack 64 rows of W at a time for int8_gemm.h's kernels.
int64_t ggml_matmul_bytes(int64_t n, int64_t cols, int threads = 1);

// y[n, Σ rows] = x Wᵀ + beta·y on the calling thread, x [n, cols] f32 (stride ld_x), where W is
// `parts` stacked by rows (a fused projection; every part has x's cols, each its own type). Part i
// writes output columns starting at the sum of the earlier parts' rows.
void ggml_matmul_rows(const float* x, int64_t n, int64_t ld_x, std::span<const GgmlMatrix> parts, float* y,
                      int64_t ld_y, float beta, void* workspace, GgmlKernel kernel = GgmlKernel::Native);

// The same with the output rows of W split across the threads (parallel_for).
void ggml_matmul(const float* x, int64_t n, int64_t ld_x, std::span<const GgmlMatrix> parts, float* y, int64_t ld_y,
                 float beta, void* workspace, GgmlKernel kernel = GgmlKernel::Native);

}  // namespace hyla
