// Range checks for flags whose messages print numbers the way people write them (CLI11's own
// PositiveNumber/NonNegativeNumber print their upper bound, DBL_MAX, as a 309-digit number), and
// renamed flags.
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

void refuse_renamed(CLI::App* cmd, const std::string& old_name, const std::string& new_name, const std::string& why) {
  static std::string ignored;
  // Thrown as a plain ParseError, not returned: CLI11 prefixes a returned message (or a thrown
  // ValidationError's) with the option's name, which a hidden option does not have.
  const std::string message = old_name + ": renamed " + new_name + "; " + why;
  cmd->add_option(old_name, ignored)->group("")->check(CLI::Validator(
      [message](std::string&) -> std::string { throw CLI::ParseError(message, CLI::ExitCodes::ValidationError); }, ""));
}

}  // namespace hyla::cli
