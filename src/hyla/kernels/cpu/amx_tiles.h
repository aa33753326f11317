#pragma once
// What the CPU backend's AMX paths share (latent_attention_amx.cpp, attention.cpp): the tile
// configuration record and the accumulator tiles by number. Only where the compiler targets AMX-BF16
// (with AVX512_BF16 for the conversions around the products); whether the kernel grants the tile
// state at run time is backend.h's amx_tiles().
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define HYLA_AMX_TILES 1

#include <cstdint>

namespace hyla::amx {

// The 64-byte record _tile_loadconfig reads (palette 1): rows and bytes per row of tiles 0-7.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Accumulator tiles 0-5 by number: the tile intrinsics name their registers in the instruction
// text, so a tile number must be a literal. The operands of accumulate are tiles 6 (A) and 7 (B).
void zero(int t);
void accumulate(int t);        // tile t += tile 6 · tile 7
void accumulate_short(int t);  // tile t += tile 4 · tile 5 (shorter operands, as configured)
void store(int t, void* out, int64_t stride);

}  // namespace hyla::amx

#endif
