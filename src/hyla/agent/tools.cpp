#include "hyla/agent/tools.h"

#include <fmt/format.h>

#include <algorithm>

namespace hyla {

using json = nlohmann::json;

std::string Tool::definition() const {
  return json{{"name", name}, {"description", description}, {"parameters", parameters}}.dump();
}

namespace {

const char* kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "null";
  }
}

bool is_type(const json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "number") return v.is_number();
  if (type == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())));
  if (type == "null") return v.is_null();
  return false;
}

}  // namespace

std::optional<std::string> schema_violation(const json& schema, const json& value, const std::string& where) {
  if (!schema.is_object()) return std::nullopt;
  if (auto t = schema.find("type"); t != schema.end() && t->is_string() && !is_type(value, t->get<std::string>()))
    return fmt::format("{}: expected {} {}, got {}", where,
                       std::string("aeiou").find(t->get<std::string>()[0]) != std::string::npos ? "an" : "a",
                       t->get<std::string>(), kind_of(value));
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array() &&
                                    std::find(e->begin(), e->end(), value) == e->end())
    return fmt::format("{}: {} is not one of {}", where, value.dump(), e->dump());
  if (value.is_number()) {
    if (auto m = schema.find("minimum"); m != schema.end() && m->is_number() && value.get<double>() < m->get<double>())
      return fmt::format("{}: {} is below the minimum {}", where, value.dump(), m->dump());
    if (auto m = schema.find("maximum"); m != schema.end() && m->is_number() && value.get<double>() > m->get<double>())
      return fmt::format("{}: {} is above the maximum {}", where, value.dump(), m->dump());
  }
  if (value.is_object()) {
    const json properties = schema.value("properties", json::object());
    for (const json& name : schema.value("required", json::array()))
      if (name.is_string() && !value.contains(name.get<std::string>()))
        return fmt::format("{}: missing the required field \"{}\"", where, name.get<std::string>());
    for (const auto& [key, field] : value.items()) {
      if (auto p = properties.find(key); p != properties.end()) {
        if (auto v = schema_violation(*p, field, where + "." + key)) return v;
      } else if (schema.value("additionalProperties", json(true)) == json(false)) {
        return fmt::format("{}: no field \"{}\" is defined", where, key);
      }
    }
  }
  if (value.is_array())
    if (auto items = schema.find("items"); items != schema.end())
      for (size_t i = 0; i < value.size(); ++i)
        if (auto v = schema_violation(*items, value[i], fmt::format("{}[{}]", where, i))) return v;
  return std::nullopt;
}

CheckedCall check_call(std::span<const Tool> tools, const ToolCall& call) {
  CheckedCall checked;
  const auto tool = std::find_if(tools.begin(), tools.end(), [&](const Tool& t) { return t.name == call.name; });
  if (tool == tools.end()) {
    std::vector<std::string> names;
    for (const Tool& t : tools) names.push_back(t.name);
    checked.error = fmt::format("no tool named \"{}\" (the tools are {})", call.name, fmt::join(names, ", "));
    return checked;
  }
  checked.arguments = json::parse(call.arguments, nullptr, false);
  if (checked.arguments.is_discarded()) {
    checked.error = "the arguments are not valid JSON";
    return checked;
  }
  if (auto v = schema_violation(tool->parameters, checked.arguments)) {
    checked.error = *v;
    return checked;
  }
  checked.tool = &*tool;
  return checked;
}

}  // namespace hyla
