#pragma once
// What the four environments (env_*.cpp) share: a name, its tools and tasks made from the seed of
// (split, index); and the expression tools of calculator and countdown.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "hyla/agent/environment.h"

namespace hyla {

template <typename EpisodeT>
class ToolEnvironment final : public Environment {
 public:
  ToolEnvironment(std::string name, std::vector<Tool> tools) : name_(std::move(name)), tools_(std::move(tools)) {}
  const std::string& name() const override { return name_; }
  const std::vector<Tool>& tools() const override { return tools_; }
  std::unique_ptr<Episode> make(Split split, uint64_t index) const override {
    return std::make_unique<EpisodeT>(split, task_seed(name_, split, index));
  }

 private:
  std::string name_;
  std::vector<Tool> tools_;
};

// A tool whose one argument is a string "expression".
inline Tool expression_tool(std::string name, std::string description) {
  return {std::move(name),
          std::move(description),
          {{"type", "object"},
           {"properties", {{"expression", {{"type", "string"}}}}},
           {"required", {"expression"}},
           {"additionalProperties", false}}};
}

// The call with its expression inside `attempt` more pairs of parentheses: the same value, another call.
inline ToolCall parenthesized(const ToolCall& call, int attempt) {
  const std::string expression = nlohmann::json::parse(call.arguments).at("expression").get<std::string>();
  const std::string open(size_t(attempt), '('), close(size_t(attempt), ')');
  return {call.name, nlohmann::json{{"expression", open + expression + close}}.dump()};
}

}  // namespace hyla
