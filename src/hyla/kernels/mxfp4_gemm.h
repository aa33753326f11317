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
// 16 column pairs of 16 bytes (byte i of pair j: row 16p + i, low nibble column 32b + 2j, high
// nibble column 32b + 2j + 1) followed by the 16 rows' scale bytes: 272 bytes per block and panel,
// the file's 4.25 bits a weight. A panel's 16 rows are one vector's lanes: a pair's 16 bytes widen
// to 16 lanes whose low and high nibbles each index a 16-entry f32 table (one vpermps), and the
// kernel never reduces across lanes. Rows past the matrix's end hold zero codes.
#include <cstdint>
#include <span>

namespace hyla {

constexpr int64_t kMxfp4Block = 32;

// A matrix in the packed layout above, 16-byte aligned; cols is a multiple of 32.
struct Mxfp4PackedMatrix {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;
};

int64_t mxfp4_packed_bytes(int64_t rows, int64_t cols);
// Packs the file form (codes [rows, cols / 2], scales [rows, cols / 32]) into dst (mxfp4_packed_bytes).
void mxfp4_pack(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, uint8_t* dst);

// The value of one code under one scale byte (e < 255), exactly.
float mxfp4_value(uint8_t code, uint8_t scale);
// The index of the first scale byte that is 0xFF (NaN), or -1.
int64_t mxfp4_first_nan_scale(const uint8_t* scales, int64_t n);
// Codes and scale of a block of 32 values that every one of them rounds to nearest (ties to the
// even code) under the scale 2^(floor(log2 max|x|) − 2), the OCP recipe: the block's largest
// magnitude lands in [4, 8) and saturates to 6. codes: 16 bytes in the file form.
uint8_t mxfp4_quantize_block(const float* x, uint8_t* codes);

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

}  // namespace hyla
