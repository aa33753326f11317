// A stateful ledger, judged on its final state (tau-bench style), not on the reply: make 2-3
// payments (shifted: 4-5) between accounts with `transfer`; each must happen exactly once. A
// failed transfer moved nothing; `balance` reads an account.
#include <fmt/format.h>

#include <map>

#include "hyla/core/random.h"
#include "hyla/agent/tool_environment.h"

namespace hyla {
namespace {

using json = nlohmann::json;

constexpr const char* kNames[] = {"alice", "bob", "carol", "dave", "erin"};

struct Payment {
  std::string from, to;
  int64_t amount;
};

class LedgerEpisode final : public Episode {
 public:
  LedgerEpisode(Split split, uint64_t seed) {
    Rng rng(seed);
    const int64_t accounts = 3 + int64_t(rng.below(2)), payments = split == Split::Shifted ? 4 + int64_t(rng.below(2)) : 2 + int64_t(rng.below(2));
    for (int64_t a = 0; a < accounts; ++a) balances_[kNames[a]] = 50 + 10 * int64_t(rng.below(16));
    expected_ = balances_;
    std::vector<std::string> said;
    while (int64_t(payments_.size()) < payments) {
      Payment p{kNames[rng.below(uint64_t(accounts))], kNames[rng.below(uint64_t(accounts))], 1 + int64_t(rng.below(40))};
      if (p.from == p.to || expected_[p.from] < p.amount) continue;
      expected_[p.from] -= p.amount;
      expected_[p.to] += p.amount;
      said.push_back(fmt::format("{} pays {} {}", p.from, p.to, p.amount));
      payments_.push_back(p);
    }
    task_ = fmt::format("Make these payments, each once: {}. Then reply \"Answer: done\".", fmt::join(said, "; "));
  }
  const std::string& task() const override { return task_; }

  json run(const std::string& tool, const json& arguments, bool corrupt) override {
    const std::string from = arguments.at(tool == "balance" ? "account" : "from").get<std::string>();
    if (!balances_.count(from)) return {{"error", fmt::format("no account named {}", from)}};
    if (tool == "balance") return {{"account", from}, {"balance", balances_[from] + (corrupt ? 10 : 0)}};
    const std::string to = arguments.at("to").get<std::string>();
    const int64_t amount = arguments.at("amount").get<int64_t>();
    if (!balances_.count(to)) return {{"error", fmt::format("no account named {}", to)}};
    if (from == to) return {{"error", "an account cannot pay itself"}};
    if (balances_[from] < amount) return {{"error", fmt::format("{} has only {}", from, balances_[from])}};
    if (!corrupt) {
      balances_[from] -= amount;
      balances_[to] += amount;
    }
    return {{"ok", true}, {"from_balance", corrupt ? balances_[from] - amount : balances_[from]}};
  }

  Verdict judge(std::string_view answer) const override { return {balances_ == expected_, !answer.empty()}; }

  ExpertMove expert(const std::vector<json>& results) const override {
    if (results.size() < payments_.size()) {
      const Payment& p = payments_[results.size()];
      // The task's own order ("alice pays bob 12"): what the model copies from comes in this order.
      const nlohmann::ordered_json arguments = {{"from", p.from}, {"to", p.to}, {"amount", p.amount}};
      return {false, {"transfer", arguments.dump()}, {}};
    }
    return {true, {}, "Answer: done"};
  }

  ToolCall rephrase(const ToolCall& call, int attempt) const override {
    nlohmann::ordered_json args = nlohmann::ordered_json::parse(call.arguments);
    args["memo"] = fmt::format("attempt {}", attempt + 1);
    return {call.name, args.dump()};
  }

 private:
  std::map<std::string, int64_t> balances_, expected_;
  std::vector<Payment> payments_;
  std::string task_;
};

}  // namespace

std::unique_ptr<Environment> make_ledger_environment() {
  const json account = {{"type", "string"}, {"enum", {"alice", "bob", "carol", "dave", "erin"}}};
  std::vector<Tool> tools;
  tools.push_back({"balance", "Read an account's balance.",
                   {{"type", "object"}, {"properties", {{"account", account}}}, {"required", {"account"}},
                    {"additionalProperties", false}}});
  tools.push_back({"transfer", "Pay an amount from one account to another (an optional memo is kept with it).",
                   {{"type", "object"},
                    {"properties", {{"from", account}, {"to", account}, {"amount", {{"type", "integer"}, {"minimum", 1}}},
                                    {"memo", {{"type", "string"}}}}},
                    {"required", {"from", "to", "amount"}},
                    {"additionalProperties", false}}});
  return std::make_unique<ToolEnvironment<LedgerEpisode>>("ledger", std::move(tools));
}

}  // namespace hyla
