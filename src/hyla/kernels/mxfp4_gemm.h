#pragma once
// Matrix products with MXFP4 weights (OCP Microscaling FP4; SPEC §8, docs/quantization.md):
// y = x · Wᵀ + beta·y, W [rows, cols] stored as 4-bit E2M1 codes (bit 3 the sign, bits 0-2 index
// the magnitudes 0, ½, 1, 1½, 2, 3, 4, 6) with one E8M0 scale byte e per 32 consecutive columns of
// each row: w = value(code) · 2^(e − 127). Every such weight is an f32 exactly, and x stays f32,
// so a product is the f32 product of the dequantised matrix (summed in another order): the
// weights cost 4.25 bits each, the activations lose nothing.
//
// File form (what hyla's files and compressed-tensors checkpoints hold): codes [rows, cols / 2],
// element 2i of a row in the low nibble of byte i and 2i+1 in its high nibble; scales
// [rows, cols / 32]. E8M0 0xFF is NaN: mxfp4_pack's callers reject it (mxfp4_check_scales).
//
// Packed layout (mxfp4_pack): panels of 16 rows; panel p holds, for each block b of 32 columns,
// 4 groups of 64 bytes, then the 16 rows' scale bytes (272 bytes per block and panel: the file's
// 4.25 bits a weight). Word i (4 bytes) of group g holds row 16p + i's codes of columns
// 32b + 8g … 32b + 8g + 7, column 32b + 8g + c in bits 4c … 4c + 3: the file's 4 bytes as they
// are. A panel's 16 rows are one vector's lanes: column c of a group is one shift of the group's
// 64 bytes and one vpermps (which reads its index's low 4 bits) from a 16-entry f32 table, so the
// kernel never reduces across lanes. Rows past the matrix's end hold zero codes.
//
// Sums: per output lane and block, column k adds x·w into partial k mod 4 (fused multiply-adds in
// column order), and total = fma((p0 + p1) + (p2 + p3), scale, total): the same operations in the
// same order in every kernel and every tiling, so results are bit for bit the same whatever the
// kernel, the rows' count or their position in the batch.
#include <cstdint>
#include <span>

namespace hyla {

constexpr int64_t kMxfp4Block = 32;
constexpr int64_t kGgmlMxfp4BlockBytes = 17;  // ggml's block of 32 (mxfp4_pack_blocks)

// A matrix in the packed layout above, 16-byte aligned; cols is a multiple of 32.
struct Mxfp4PackedMatrix {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
};

int64_t mxfp4_packed_bytes(int64_t rows, int64_t cols);
// Packs the file form (codes [rows, cols / 2], scales [rows, cols / 32]) into dst (mxfp4_packed_bytes).
void mxfp4_pack(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* dst);
// The same straight from ggml's MXFP4 blocks, row after row (17 bytes a block: the E8M0 scale, then
// 16 bytes whose low nibbles hold the block's values 0–15 and high nibbles 16–31; GGUF's layout),
// in one pass with no copy in between. Returns the index of the first block whose scale is 0xFF
// (NaN), or -1; dst is then written all the same.
int64_t mxfp4_pack_blocks(const uint8_t* blocks, int64_t rows, int64_t cols, uint8_t* dst);

// The value of one code under one scale byte (e < 255), exactly.
float mxfp4_value(uint8_t code, uint8_t scale);
// The index of the first scale byte that is 0xFF (NaN), or -1.
int64_t mxfp4_first_nan_scale(const uint8_t* scales, int64_t n);
// The same over n ggml MXFP4 blocks (mxfp4_pack_blocks), their scales 17 bytes apart.
int64_t mxfp4_blocks_first_nan_scale(const uint8_t* blocks, int64_t n);
// Codes and scale of a block of 32 values that every one of them rounds to nearest (ties to the
// even code) under the scale 2^(floor(log2 max|x|) − 2), the OCP recipe: the block's largest
// magnitude lands in [4, 8) and saturates to 6. codes: 16 bytes in the file form.
uint8_t mxfp4_quantize_block(const float* x, uint8_t* codes);
// Quantises weights w [rows, cols] (cols a multiple of 32) into codes [rows, cols / 2] and scales
// [rows, cols / 32], mxfp4_quantize_block per block. Rows in parallel.
void quantize_mxfp4_weights(const float* w, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales);

// Which code runs: the AVX-512 kernel where hyla was compiled for it, else the AVX2 one where
// compiled for AVX2 and FMA, else the portable one. Avx2 and Portable force those (tests,
// benchmarks); every kernel writes the same bits (the same fused multiply-adds in the same order).
enum class Mxfp4Kernel : uint8_t { Native, Avx2, Portable };
bool mxfp4_kernel_available(Mxfp4Kernel kernel);

// y[n, Σ rows] = x Wᵀ + beta·y on the calling thread, x [n, cols] f32 (stride ld_x), where W is
// `parts` stacked by rows (a fused projection; every part has x's cols). Part i writes output
// columns starting at the sum of the earlier parts' rows.
void mxfp4_matmul_rows(const float* x, int64_t n, int64_t ld_x, std::span<const Mxfp4PackedMatrix> parts, float* y,
                       int64_t ld_y, float beta, Mxfp4Kernel kernel = Mxfp4Kernel::Native);

// The same product with x rounded to 8 bits per block of 32 (s_x = max|x| / 127, q = round to
// nearest even of x / s_x, as int8_gemm.h rounds activations and as llama.cpp's CPU MXFP4 path
// does): each block adds s_x · 2^(e − 128) · Σ q · (2·value(code)), the integer sum exact (the
// doubled E2M1 values are integers). With AVX-512 VNNI a 64-byte group is one shift, two masks and
// two vpshufb table lookups, then 16 rows × 4 columns per vpdpbusd. `workspace`:
// mxfp4_q8_rows_bytes. Where hyla was not compiled for AVX-512 VNNI only the portable kernel runs
// it (slow: use the f32 product there, mxfp4_q8_native()).
bool mxfp4_q8_native();
int64_t mxfp4_q8_rows_bytes(int64_t rows, int64_t cols);
void mxfp4_matmul_rows_q8(const float* x, int64_t n, int64_t ld_x, std::span<const Mxfp4PackedMatrix> parts, float* y,
                          int64_t ld_y, float beta, void* workspace, Mxfp4Kernel kernel = Mxfp4Kernel::Native);

}  // namespace hyla
