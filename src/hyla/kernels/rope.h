#pragma once
// Rotary position embedding (SPEC §4): pair i of a dim-wide vector, (x[2i], x[2i+1]), rotates by
// the angle pos·θ^(−2i/dim) to (x0·cos − x1·sin, x0·sin + x1·cos). The backward pass is the
// rotation by the negative angle (the transpose of a rotation is its inverse).
#include <cstdint>

#include "hyla/kernels/layout.h"

namespace hyla {

// cos and sin of each row's angles, [rows, dim]: row r holds cos of pairs 0..dim/2−1, then their
// sin, for the angle positions[r]·θ^(−2i/dim). Angles are formed and evaluated in double: at
// positions near 2^20 an f32 angle would be off by ~0.06 rad.
void rope_table(const int64_t* positions, int64_t rows, int64_t dim, double theta, float* table);

// The table of a vision tower's 2-D rotary positions (SPEC §7): for i < dim/4, pair 2i turns by
// columns[r]·θ^(−4i/dim) and pair 2i+1 by rows[r]·θ^(−4i/dim) (the column first, as MoonViT's code
// has it). dim must be a multiple of 4. Same layout as rope_table.
void rope_table_2d(const int64_t* rows, const int64_t* columns, int64_t n, int64_t dim, double theta, float* table);

// y = rotation of x, per row (by that row's table entry) and head. y may alias x.
void rope_forward(const float* table, int64_t rows, int64_t heads, int64_t dim, const float* x, HeadLayout x_layout,
                  float* y, HeadLayout y_layout);
// dx = rotation of dy by the negative angles. dx may alias dy.
void rope_backward(const float* table, int64_t rows, int64_t heads, int64_t dim, const float* dy,
                   HeadLayout dy_layout, float* dx, HeadLayout dx_layout);

}  // namespace hyla
