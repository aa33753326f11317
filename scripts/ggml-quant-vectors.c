// Test vectors for hyla's decoders of ggml's block types (tests/data/ggml_quant_vectors.txt),
// produced by ggml's own code: for every type hyla reads, one row of 256 values quantised by
// ggml_quantize_chunk (with an importance matrix) and two super-blocks of random bytes, each
// decoded by ggml's to_float. scripts/ggml-quant-vectors.sh builds and runs this.
//
// Output, per type: "type NAME VALUES", "blocks HEX", "values HEX32 ..." (the f32 bit patterns), and
// "stress SEED BLOCKS HASH": BLOCKS blocks of random bytes drawn by xorshift64* from SEED (a block
// drawn again until its values are finite), decoded, the FNV-1a hash of all their f32 bits; enough
// blocks that every grid point of the IQ types is used (the test draws the same blocks).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

static uint64_t state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) {  // xorshift64*
  state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
  return state * 0x2545f4914f6cdd1dull;
}
static float uniform(void) { return (float)((next_random() >> 11) * 0x1.0p-53); }
static float gaussian(void) { return sqrtf(-2.0f * logf(uniform() + 1e-12f)) * cosf(6.2831853f * uniform()); }

static uint64_t fnv1a(uint64_t hash, const void* data, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ ((const uint8_t*)data)[i]) * 0x100000001b3ull;
  return hash;
}

static int all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!isfinite(x[i])) return 0;
  return 1;
}

int main(void) {
  const enum ggml_type types[] = {
      GGML_TYPE_Q4_0,   GGML_TYPE_Q4_1,  GGML_TYPE_Q5_0,    GGML_TYPE_Q5_1,  GGML_TYPE_Q8_0,   GGML_TYPE_Q2_K,
      GGML_TYPE_Q3_K,   GGML_TYPE_Q4_K,  GGML_TYPE_Q5_K,    GGML_TYPE_Q6_K,  GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS,
      GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ1_S, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ3_S, GGML_TYPE_IQ2_S,  GGML_TYPE_IQ4_XS,
      GGML_TYPE_IQ1_M,  GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0,   GGML_TYPE_MXFP4};
  enum { kRow = 256, kRandom = 512, kValues = kRow + kRandom };
  float x[kRow], imatrix[kRow], y[kValues];
  uint8_t blocks[kValues * 4];
  for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); ++t) {
    const enum ggml_type type = types[t];
    const struct ggml_type_traits* traits = ggml_get_type_traits(type);
    for (int i = 0; i < kRow; ++i) {
      x[i] = gaussian() * (i % 37 == 0 ? 4.0f : 1.0f) * 0.02f;
      imatrix[i] = 0.1f + uniform();
    }
    const size_t row_bytes = ggml_quantize_chunk(type, x, blocks, 0, 1, kRow, imatrix);
    const size_t random_bytes = ggml_row_size(type, kRandom);
    const int64_t block_values = traits->blck_size;
    const size_t block_bytes = traits->type_size;
    for (size_t b = 0; b < random_bytes / block_bytes; ++b) {  // random blocks whose values are finite
      uint8_t* p = blocks + row_bytes + b * block_bytes;
      do {
        for (size_t i = 0; i < block_bytes; ++i) p[i] = (uint8_t)next_random();
        traits->to_float(p, y, block_values);
      } while (!all_finite(y, block_values));
    }
    traits->to_float(blocks, y, kValues);
    printf("type %s %d\nblocks ", ggml_type_name(type), kValues);
    for (size_t i = 0; i < row_bytes + random_bytes; ++i) printf("%02x", blocks[i]);
    printf("\nvalues");
    for (int i = 0; i < kValues; ++i) {
      uint32_t bits;
      memcpy(&bits, &y[i], 4);
      printf(" %08x", bits);
    }
    printf("\n");

    const uint64_t seed = 1000 + (uint64_t)type;
    const int stress_blocks = block_values == 32 ? 256 : 1024;  // IQ1_S: 32 grid draws a block, 2048 points
    uint64_t hash = 0xcbf29ce484222325ull;
    state = seed;
    for (int b = 0; b < stress_blocks; ++b) {
      uint8_t block[256];
      do {
        for (size_t i = 0; i < block_bytes; ++i) block[i] = (uint8_t)next_random();
        traits->to_float(block, y, block_values);
      } while (!all_finite(y, block_values));
      hash = fnv1a(hash, y, (size_t)block_values * 4);
    }
    printf("stress %llu %d %016llx\n", (unsigned long long)seed, stress_blocks, (unsigned long long)hash);
  }
  ggml_quantize_free();
  return 0;
}
