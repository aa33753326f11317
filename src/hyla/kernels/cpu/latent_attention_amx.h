#pragma once
// latent_attention_decode's unit of work on AMX tiles (latent_attention.cpp chooses it): the same
// piece of one sequence's bf16 cache as its vector path takes, the same partial result.
//
// Over the unit's rows, in phases that each run over all of them (the TMUL unit slows down when
// other work separates its instructions), with heads in groups of w = 4, 8 or 16 (the narrowest
// that holds them; padding heads have a zero query), after one pass that reads the rows in order
// and interleaves them for the value products:
//   scores   [rows × w heads] = rows · Q : A tiles are the cached rows as they lie (16 rows × 32
//            values each), B tiles the query packed once per call as pairs (pack_query);
//   softmax  exact over the unit (its max and sum are the partial result's), in f32, 16 / w rows
//            a vector (lane j is head j mod w);
//   values   o_h = Σ_s p_h,s·c_s : A tiles are the probabilities transposed to [w heads × 32
//            rows] bf16, B tiles two rows interleaved value by value (as vpunpck delivers them, so
//            each 32-value segment of o comes out permuted and is put in order at the end),
//            accumulated over the unit in six tiles per pass over o's 16-value blocks.
// The products are exact in f32 from bf16 inputs (the query and probabilities rounded to bf16),
// as the vdpbf16ps path's are. Needs K = R + Dr a multiple of 32 and R a multiple of 32.
#include <cstddef>
#include <cstdint>

#include "hyla/core/half.h"

namespace hyla::latent_amx {

// Whether this path can run the shape here (amx_tiles(), and the shape's multiples).
bool usable(int64_t heads, int64_t latent, int64_t K);

// Query operand of one sequence: scale · q [H, K] as B tiles, uint32 pairs [groups][K/32][16][16].
size_t query_words(int64_t heads, int64_t K);
void pack_query(int64_t heads, int64_t K, float scale, const float* q, uint32_t* out);

// Scratch one thread needs for run_unit over units of up to max_rows rows, in bytes.
size_t thread_bytes(int64_t heads, int64_t latent, int64_t K, int64_t max_rows);

// Rows [begin, end) of `rows` ([length, K] bf16) against a packed query: writes the unnormalised
// output [H × R], then the running max [H] and sum [H] of the scores, to `partial`.
void run_unit(int64_t heads, int64_t latent, int64_t K, const bf16* rows, int64_t begin, int64_t end,
              const uint32_t* query, float* partial, void* scratch);

}  // namespace hyla::latent_amx
