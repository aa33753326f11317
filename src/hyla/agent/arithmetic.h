#pragma once
// Integer arithmetic expressions, for the calculator's and countdown's tools and scorers: decimal
// integers, + - * /, unary minus and parentheses, with the usual precedence. Division must be
// exact and results stay within ±10^15, so every value is an exact integer.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hyla {

struct ArithmeticResult {
  bool ok = false;
  int64_t value = 0;
  std::string error;              // why not ok: names the problem and where
  std::vector<int64_t> literals;  // the numbers written in the expression, in order
};

ArithmeticResult evaluate_arithmetic(std::string_view expression);

}  // namespace hyla
