#pragma once
// The tools an environment offers, and the check every call passes before it runs: the name must
// be offered and the arguments must be an instance of the tool's parameter schema. The schema
// subset is what tool definitions use: type (object, string, integer, number, boolean, array),
// properties, required, additionalProperties: false, enum, minimum, maximum, items. A call that
// fails the check never reaches the environment: it becomes an error observation naming the rule
// it broke, and is counted as invalid.
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hyla/data/chat_template.h"

namespace hyla {

struct Tool {
  std::string name, description;
  nlohmann::json parameters;  // a JSON Schema of the arguments object
  // {"name", "description", "parameters"}: one of ChatOptions::tools (data/chat_template.h).
  std::string definition() const;
};

// Where `value` breaks `schema`, as "arguments.field: rule" (nullopt: it is an instance).
std::optional<std::string> schema_violation(const nlohmann::json& schema, const nlohmann::json& value,
                                            const std::string& where = "arguments");

struct CheckedCall {
  const Tool* tool = nullptr;  // null when the call is invalid
  nlohmann::json arguments;
  std::string error;           // why it is invalid
};
CheckedCall check_call(std::span<const Tool> tools, const ToolCall& call);

}  // namespace hyla
