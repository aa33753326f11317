#pragma once
// The ggml tensor types a GGUF file may hold: their numbering, block geometry, and decoding to f32.
// Decoding equals ggml's reference dequantize_row_* bit for bit (each product and sum rounded as
// written there, no fused multiply-add; tests/test_ggml_types.cpp checks committed vectors that
// scripts/ggml-quant-vectors.sh produced with ggml's own code). hyla writes F32, F16, BF16, Q8_0
// and MXFP4; it reads every type below.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace hyla {

// ggml.h's enum ggml_type numbering, for the types hyla reads.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13,
  Q6_K = 14, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39
};

// "F32", "Q4_K", ... for any ggml type number (for messages); "type N" when unknown.
std::string ggml_type_name(uint32_t type);
// Every type hyla reads, in enum order.
std::span<const GgmlType> ggml_readable_types();
bool ggml_type_readable(uint32_t type);
// The types hyla writes (F32, F16, BF16, Q8_0, MXFP4).
bool ggml_type_writable(uint32_t type);
// A type hyla writes, by name ("f32", "F16", "q8_0", "mxfp4"; any case).
GgmlType ggml_type_from_name(std::string_view name);
int64_t ggml_block_values(GgmlType type);  // values per block: 1, 32 or 256
int64_t ggml_block_bytes(GgmlType type);   // bytes per block
// Bytes of `n` values (n a multiple of the block).
uint64_t ggml_bytes(GgmlType type, int64_t n);

// n values (a multiple of the block) of any readable type to f32.
void ggml_to_f32(GgmlType type, const uint8_t* src, float* dst, int64_t n);
// Quantised types (every readable type but F32, F16 and BF16) decode through one representation,
// which the products of kernels/ggml_gemm.h read as well: value i of a run of blocks is
// scale[i / 16] · q[i] − min[i / 16], q an int8, scale and min f32 per group of kGgmlGroup values
// (a type whose scale covers 32 or 256 values repeats it), min 0 for types without offsets.
// Every scale is the factor ggml multiplies by, rounded as ggml rounds it, so ggml_to_f32 equals
// ggml's dequantisation bit for bit.
constexpr int64_t kGgmlGroup = 16;
bool ggml_type_quantized(GgmlType type);
bool ggml_type_has_min(GgmlType type);  // Q4_1, Q5_1, Q2_K, Q4_K, Q5_K
// n values (a multiple of the block) of a quantised type into q [n], scale [n / 16] and, where the
// type has offsets, min [n / 16] (untouched otherwise).
void ggml_unpack(GgmlType type, const uint8_t* src, int64_t n, int8_t* q, float* scale, float* min);
// The first of `count` blocks whose f16 scale is not finite (for MXFP4: whose scale byte is 0xFF,
// NaN), or -1. The blocks of the other quantised types decode to finite values exactly when
// their scales are finite.
int64_t ggml_first_nonfinite_block(GgmlType type, const uint8_t* blocks, int64_t count);
// f32 to F32, F16, BF16 or Q8_0 (MXFP4 is written from packed MXFP4 data only).
void f32_to_ggml(GgmlType type, const float* src, uint8_t* dst, int64_t n);

// ggml-quants.c's quantize_row_q8_0_ref, bit for bit.
void quantize_q8_0(const float* src, uint8_t* dst, int64_t n);
// ggml's MXFP4 blocks (17 bytes: the E8M0 scale, then 16 bytes whose low nibbles hold values 0-15
// and high nibbles 16-31) to and from the file form of kernels/mxfp4_gemm.h (the codes two a byte
// in order, then one scale byte per 32 values), for n values (a multiple of 32): only bits move.
void mxfp4_blocks_to_codes(const uint8_t* blocks, int64_t n, uint8_t* codes, uint8_t* scales);
void mxfp4_codes_to_blocks(const uint8_t* codes, const uint8_t* scales, int64_t n, uint8_t* blocks);

}  // namespace hyla
