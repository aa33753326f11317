// Range checks for flags whose messages print numbers the way people write them: CLI11's own
// PositiveNumber/NonNegativeNumber print their upper bound, DBL_MAX, as a 309-digit number.
#include <cmath>
#include <string>

#include "commands.h"

namespace hyla::cli {
namespace {

CLI::Validator finite_at_least(double low, bool strict, const char* what) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "'" + text + "' is not a number";
        if (!std::isfinite(value) || value < low || (strict && value == low)) return "must be " + std::string(what) + ", got " + text;
        return {};
      },
      strict ? "POSITIVE" : "NONNEGATIVE");
}

}  // namespace

const CLI::Validator& positive() {
  static const CLI::Validator check = finite_at_least(0.0, true, "a finite number > 0");
  return check;
}

const CLI::Validator& non_negative() {
  static const CLI::Validator check = finite_at_least(0.0, false, "a finite number >= 0");
  return check;
}

}  // namespace hyla::cli
