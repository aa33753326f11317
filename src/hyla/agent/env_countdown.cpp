// Countdown: reach a target from 3-4 numbers (shifted: 5), each used at most once, with + - * /.
// Every task is solvable (the target is built from the numbers); `check` evaluates a candidate
// and says whether it is a solution. The answer is the expression. The expert finds its solution
// by search over what the task shows (the numbers and the target), never from how the task was
// made.
#include <fmt/format.h>

#include <algorithm>

#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/agent/arithmetic.h"
#include "hyla/agent/tool_environment.h"

namespace hyla {
namespace {

using json = nlohmann::json;

class CountdownEpisode final : public Episode {
 public:
  CountdownEpisode(Split split, uint64_t seed) {
    Rng rng(seed);
    const int64_t n = split == Split::Shifted ? 5 : 3 + int64_t(rng.below(2));
    for (;;) {
      numbers_.clear();
      for (int64_t i = 0; i < n; ++i) numbers_.push_back(1 + int64_t(rng.below(i == 0 ? 100 : 25)));
      std::vector<int64_t> order = numbers_;
      for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
      std::string text = std::to_string(order[0]);
      for (size_t i = 1; i < order.size(); ++i) {
        const char op = "+-*"[rng.below(3)];
        text = i == 1 ? fmt::format("{} {} {}", text, op, order[i]) : fmt::format("({}) {} {}", text, op, order[i]);
      }
      const ArithmeticResult r = evaluate_arithmetic(text);
      if (r.ok && r.value > 0 && r.value <= 1000) {
        target_ = r.value;
        break;
      }
    }
    wants_near_miss_ = rng.below(2) == 0;
    task_ = fmt::format("Reach {} using the numbers {} (each at most once) with + - * /.", target_, fmt::join(numbers_, ", "));
  }
  const std::string& task() const override { return task_; }

  std::optional<std::string> misuse(const ArithmeticResult& r) const {
    std::vector<int64_t> left = numbers_;
    for (int64_t x : r.literals) {
      const auto it = std::find(left.begin(), left.end(), x);
      if (it == left.end()) return fmt::format("{} is not one of the numbers left", x);
      left.erase(it);
    }
    return std::nullopt;
  }

  json run(const std::string&, const json& arguments, bool corrupt) override {
    const ArithmeticResult r = evaluate_arithmetic(arguments.at("expression").get<std::string>());
    if (!r.ok) return {{"error", r.error}};
    if (auto m = misuse(r)) return {{"value", r.value}, {"solved", false}, {"reason", *m}};
    const int64_t value = corrupt ? r.value + 1 + int64_t(std::abs(r.value) % 7) : r.value;
    return {{"value", value}, {"solved", value == target_}};
  }

  Verdict judge(std::string_view answer) const override {
    const ArithmeticResult r = evaluate_arithmetic(answer);
    return {r.ok && !misuse(r) && r.value == target_, r.ok};
  }

  // The first ((a op b) op c) ... over every order of all the numbers (lexicographic) and every
  // choice of + − × that reaches the target: the family every task is built from, so one exists.
  std::string searched_solution() const {
    std::vector<int64_t> order = numbers_;
    std::sort(order.begin(), order.end());
    const size_t ops = order.size() - 1;
    size_t choices = 1;
    for (size_t i = 0; i < ops; ++i) choices *= 3;
    do {
      for (size_t c = 0; c < choices; ++c) {
        std::string text = std::to_string(order[0]);
        for (size_t i = 1, code = c; i < order.size(); ++i, code /= 3)
          text = i == 1 ? fmt::format("{} {} {}", text, "+-*"[code % 3], order[i])
                        : fmt::format("({}) {} {}", text, "+-*"[code % 3], order[i]);
        const ArithmeticResult r = evaluate_arithmetic(text);
        if (r.ok && r.value == target_) return text;
      }
    } while (std::next_permutation(order.begin(), order.end()));
    HYLA_ASSERT(false && "every countdown task is built from its numbers");
    return {};
  }

  ExpertMove expert(const std::vector<json>& results) const override {
    const std::string solution = searched_solution();
    // A near miss it may check first: the same numbers, the last operation changed.
    std::string near_miss = solution;
    const size_t last = near_miss.find_last_of("+-*");
    near_miss[last] = near_miss[last] == '+' ? '-' : '+';
    const bool try_near_miss = wants_near_miss_ && evaluate_arithmetic(near_miss).value != target_;
    const size_t checks = try_near_miss ? 2 : 1;
    if (results.size() < checks)
      return {false, {"check", json{{"expression", results.empty() && try_near_miss ? near_miss : solution}}.dump()}, {}};
    return {true, {}, "Answer: " + solution};
  }

  ToolCall rephrase(const ToolCall& call, int attempt) const override { return parenthesized(call, attempt); }

 private:
  std::vector<int64_t> numbers_;
  int64_t target_ = 0;
  std::string task_;
  bool wants_near_miss_ = false;
};

}  // namespace

std::unique_ptr<Environment> make_countdown_environment() {
  return std::make_unique<ToolEnvironment<CountdownEpisode>>(
      "countdown", std::vector<Tool>{expression_tool(
                       "check", "Evaluate a candidate expression over the numbers and say whether it reaches the target.")});
}

}  // namespace hyla
