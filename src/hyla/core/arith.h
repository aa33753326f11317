#pragma once
// Integer rounding for tile counts, padded strides and buffer alignment (x >= 0, m > 0).
#include <cstdint>

namespace hyla {

// ⌈x / m⌉: how many m-sized pieces cover x.
constexpr int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }
// The smallest multiple of m that is at least x.
constexpr int64_t round_up(int64_t x, int64_t m) { return ceil_div(x, m) * m; }

}  // namespace hyla
