#pragma once
// Matrix products with int8 weights (docs/quantization.md): y = x · Wᵀ + beta·y, W [rows, cols]
// stored as int8 values q_w with one f32 scale s_w per `block` consecutive columns of each row
// (w ≈ s_w · q_w), x f32, quantised on the fly the same way per row and block (x ≈ s_x · q_x,
// q_x ∈ [−127, 127], s_x = max|x| / 127 over the block). Each block adds s_w · s_x · Σ q_w q_x
// to the output: the integer sum is exact (int32), the blocks are added in f32.
//
// The AVX-512 VNNI kernel multiplies unsigned by signed bytes (vpdpbusd), so the packed weights
// hold q_w + 128 ∈ [0, 255] and the integer accumulator of each (x row, block) starts at
// −128 · Σ q_x instead of 0: the sum then comes out as Σ q_w q_x exactly, with the correction
// computed once per activation block instead of being stored per weight block (which would add
// 4 bytes per block to every weight row's memory traffic).
//
// Packed layout (int8_pack): panels of 16 rows; panel p holds, for each block b in order, block/4
// "quads" of 64 bytes (byte 4i + j of quad k: row 16p + i, column b·block + 4k + j, as q_w + 128)
// followed by the 16 rows' scales of block b (f32). One block of one panel is block·16 + 64
// bytes, so every quad and every scale vector starts 64-byte aligned; rows past the matrix's end
// hold zeros with scale 0. A panel's 16 rows are one vector's lanes, so the kernels never reduce
// across lanes, and each vpdpbusd takes its x operand as a broadcast of 4 bytes from memory.
#include <cstdint>
#include <span>

namespace hyla {

// Block sizes the kernels accept: 16, 32, 64, 128 or 256. The native kernel sums a block in
// steps of at most 32 columns (8 fully unrolled vpdpbusd per output vector): each step's integer
// sum is exact (every partial sum stays below 32 · 255 · 127 + 128 · 32 · 127 < 2^21 in
// magnitude, so its f32 conversion is exact too) and the steps are added in f32. Blocks above 32
// make files smaller, not products faster.
bool int8_block_supported(int64_t block);
int64_t int8_step(int64_t block);  // min(block, 32)

// A matrix in the packed layout above, 64-byte aligned; cols is a multiple of block.
struct Int8PackedMatrix {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0, block = 0;
};

int64_t int8_packed_bytes(int64_t rows, int64_t cols, int64_t block);
// Packs row-major values [rows, cols] and scales [rows, cols / block] into dst (int8_packed_bytes).
void int8_pack(const int8_t* values, const float* scales, int64_t rows, int64_t cols, int64_t block, uint8_t* dst);
// Quantises weights w [rows, cols] (cols a multiple of block) into values [rows, cols] and scales
// [rows, cols / block]: per block s = max|w| / 127 and q = round(w / s) in [−127, 127] (0 where
// s = 0). Rows in parallel.
void quantize_int8_weights(const float* w, int64_t rows, int64_t cols, int64_t block, int8_t* values, float* scales);

// Quantised activation rows, carved out of a caller's workspace (int8_rows_bytes): values
// [rows, cols], scales s_x [rows, cols / block], and per step of int8_step(block) columns the
// integer accumulator's start −128 · Σ q_x [rows, cols / step].
struct Int8Rows {
  int8_t* values = nullptr;
  float* scales = nullptr;
  int32_t* starts = nullptr;
  int64_t rows = 0, cols = 0, block = 0;
};
int64_t int8_rows_bytes(int64_t rows, int64_t cols, int64_t block);
Int8Rows int8_rows_view(void* workspace, int64_t rows, int64_t cols, int64_t block);

// Which code runs: the AVX-512 (VNNI) kernels when hyla was compiled for them, else the AVX2
// products (maddubs) where compiled for AVX2, else the portable ones (plain C++ the compiler
// vectorises); Portable forces the portable code (tests, benchmarks).
enum class Int8Kernel : uint8_t { Native, Portable };
bool int8_native_kernels();  // compiled with AVX512_VNNI or AVX2

// Quantises rows [first, last) of x (row stride ld_x) into `out`, rounding to nearest even; both
// kernels write the same bytes.
void quantize_int8_rows(const float* x, int64_t ld_x, const Int8Rows& out, int64_t first, int64_t last,
                        Int8Kernel kernel = Int8Kernel::Native);

// y[n, Σ rows] = x Wᵀ + beta·y on the calling thread, where W is `parts` stacked by rows (a fused
// projection; every part has x's cols and block) and n = x.rows. Part i writes output columns
// starting at the sum of the earlier parts' rows.
void int8_matmul_rows(const Int8Rows& x, std::span<const Int8PackedMatrix> parts, float* y, int64_t ld_y,
                      float beta, Int8Kernel kernel = Int8Kernel::Native);

// The same from f32 rows x [n, cols] (stride ld_x), quantised into `workspace` (int8_rows_bytes(n,
// cols, block)), on the OpenMP threads: rows of x split for the quantisation, then output panels
// split across threads (each thread streams its share of the weights once per chunk of rows).
void int8_matmul(const float* x, int64_t n, int64_t ld_x, std::span<const Int8PackedMatrix> parts, float* y,
                 int64_t ld_y, float beta, void* workspace, Int8Kernel kernel = Int8Kernel::Native);

}  // namespace hyla
