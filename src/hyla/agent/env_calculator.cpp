// Calculator chains: compute an expression of 3-5 operands (shifted: 6-7) with the `calc` tool.
// The expert sends the task's whole expression in one call and answers with the result: copying
// the expression into the call and the result into the answer is the skill a small model can
// learn from demonstrations (one operation per call made them long and their numbers new).
#include <fmt/format.h>

#include "hyla/core/random.h"
#include "hyla/agent/arithmetic.h"
#include "hyla/agent/tool_environment.h"

namespace hyla {
namespace {

using json = nlohmann::json;

std::optional<int64_t> parse_integer(std::string_view text) {
  const ArithmeticResult r = evaluate_arithmetic(text);
  if (!r.ok || r.literals.size() != 1 || text.find_first_of("+*/()") != std::string_view::npos) return std::nullopt;
  return r.value;
}

class CalculatorEpisode final : public Episode {
 public:
  CalculatorEpisode(Split split, uint64_t seed) {
    Rng rng(seed);
    const bool shifted = split == Split::Shifted;
    const int64_t n = shifted ? 6 + int64_t(rng.below(2)) : 3 + int64_t(rng.below(3));
    std::string text = std::to_string(1 + int64_t(rng.below(20)));
    for (int64_t i = 1; i < n; ++i) {
      const char op = "+-*"[rng.below(3)];
      const int64_t x = op == '*' ? 2 + int64_t(rng.below(8)) : 1 + int64_t(rng.below(50));
      text = i == 1 ? fmt::format("{} {} {}", text, op, x) : fmt::format("({}) {} {}", text, op, x);
    }
    expression_ = text;
    answer_ = evaluate_arithmetic(text).value;
    task_ = fmt::format("Compute {}.", text);
  }
  const std::string& task() const override { return task_; }

  json run(const std::string&, const json& arguments, bool corrupt) override {
    const ArithmeticResult r = evaluate_arithmetic(arguments.at("expression").get<std::string>());
    if (!r.ok) return {{"error", r.error}};
    return {{"result", corrupt ? r.value + (r.value % 2 == 0 ? 1 : -1) * (1 + int64_t(std::abs(r.value) % 9)) : r.value}};
  }

  Verdict judge(std::string_view answer) const override {
    const auto value = parse_integer(answer);
    return {value && *value == answer_, value.has_value()};
  }

  ExpertMove expert(const std::vector<json>& results) const override {
    if (results.empty()) return {false, {"calc", json{{"expression", expression_}}.dump()}, {}};
    const json& last = results.back();
    if (!last.contains("result")) return {true, {}, "Answer: unknown"};
    return {true, {}, fmt::format("Answer: {}", last["result"].get<int64_t>())};
  }

  ToolCall rephrase(const ToolCall& call, int attempt) const override { return parenthesized(call, attempt); }

 private:
  std::string expression_, task_;
  int64_t answer_ = 0;
};

}  // namespace

std::unique_ptr<Environment> make_calculator_environment() {
  return std::make_unique<ToolEnvironment<CalculatorEpisode>>(
      "calculator",
      std::vector<Tool>{expression_tool("calc", "Evaluate an integer arithmetic expression (+, -, *, /, parentheses).")});
}

}  // namespace hyla
