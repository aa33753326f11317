#include "hyla/agent/arithmetic.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>

namespace hyla {
namespace {

constexpr int64_t kLimit = 1000000000000000;  // 10^15
constexpr int kMaxDepth = 32;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  ArithmeticResult run() {
    ArithmeticResult e;
    int64_t value = 0;
    if (!sum(value, 0)) {
      e.error = error_;
      return e;
    }
    skip_space();
    if (at_ < text_.size()) {
      e.error = fmt::format("unexpected '{}' at character {}", text_[at_], at_ + 1);
      return e;
    }
    e.ok = true;
    e.value = value;
    e.literals = std::move(literals_);
    return e;
  }

 private:
  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  bool peek(char c) {
    skip_space();
    return at_ < text_.size() && text_[at_] == c;
  }
  bool failed(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  bool checked(int64_t value, int64_t& out) {
    if (value > kLimit || value < -kLimit) return failed("a value past 10^15");
    out = value;
    return true;
  }

  bool sum(int64_t& out, int depth) {
    if (!product(out, depth)) return false;
    for (;;) {
      const bool plus = peek('+');
      if (!plus && !peek('-')) return true;
      ++at_;
      int64_t rhs = 0;
      if (!product(rhs, depth) || !checked(plus ? out + rhs : out - rhs, out)) return false;
    }
  }

  bool product(int64_t& out, int depth) {
    if (!factor(out, depth)) return false;
    for (;;) {
      const bool times = peek('*');
      if (!times && !peek('/')) return true;
      ++at_;
      int64_t rhs = 0;
      if (!factor(rhs, depth)) return false;
      if (times) {
        if (rhs != 0 && (out > kLimit / std::abs(rhs) || out < -kLimit / std::abs(rhs)))
          return failed("a value past 10^15");
        out *= rhs;
      } else {
        if (rhs == 0) return failed("division by zero");
        if (out % rhs != 0) return failed(fmt::format("{} / {} is not a whole number", out, rhs));
        out /= rhs;
      }
    }
  }

  bool factor(int64_t& out, int depth) {
    if (depth > kMaxDepth) return failed("parentheses nested too deeply");
    skip_space();
    if (at_ >= text_.size()) return failed("the expression ends where a number was expected");
    const char c = text_[at_];
    if (c == '-') {
      ++at_;
      if (!factor(out, depth + 1)) return false;
      out = -out;
      return true;
    }
    if (c == '(') {
      ++at_;
      if (!sum(out, depth + 1)) return false;
      if (!peek(')')) return failed(fmt::format("missing ')' at character {}", at_ + 1));
      ++at_;
      return true;
    }
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return failed(fmt::format("unexpected '{}' at character {}", c, at_ + 1));
    int64_t value = 0;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) {
      value = value * 10 + (text_[at_++] - '0');
      if (value > kLimit) return failed("a number past 10^15");
    }
    literals_.push_back(value);
    out = value;
    return true;
  }

  std::string_view text_;
  size_t at_ = 0;
  std::string error_;
  std::vector<int64_t> literals_;
};

}  // namespace

ArithmeticResult evaluate_arithmetic(std::string_view expression) {
  if (expression.size() > 1000) return {false, 0, "an expression over 1000 characters", {}};
  return Parser(expression).run();
}

}  // namespace hyla
