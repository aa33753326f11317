#include "hyla/io/json_fields.h"

#include "hyla/io/file.h"

namespace hyla {
using json = nlohmann::json;

const json JsonFields::kEmpty = json::object();

JsonFields::JsonFields(const json& object, std::string source, std::string prefix)
    : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {
  HYLA_CHECK(object_.is_object(), "{}: {} must be a JSON object", source_, prefix_.empty() ? "the file" : prefix_);
}

const json* JsonFields::get(const std::string& key, bool (json::*is)() const noexcept, const char* type_name) {
  seen_.insert(key);
  auto it = object_.find(key);
  if (it == object_.end()) return nullptr;
  HYLA_CHECK(((*it).*is)(), "{}: {} must be {}, got {}", source_, path(key), type_name, json_excerpt(*it));
  return &*it;
}

void JsonFields::read(const std::string& key, bool& out) {
  if (const json* v = get(key, &json::is_boolean, "true or false")) out = v->get<bool>();
}

void JsonFields::read(const std::string& key, int64_t& out) {
  if (const json* v = get(key, &json::is_number_integer, "an integer")) out = v->get<int64_t>();
}

void JsonFields::read(const std::string& key, double& out) {
  if (const json* v = get(key, &json::is_number, "a number")) out = v->get<double>();
}

void JsonFields::read(const std::string& key, std::string& out) {
  if (const json* v = get(key, &json::is_string, "a string")) out = v->get<std::string>();
}

void JsonFields::read(const std::string& key, std::vector<std::string>& out) {
  const json* v = get(key, &json::is_array, "a list of strings");
  if (!v) return;
  out.clear();
  for (const json& item : *v) {
    HYLA_CHECK(item.is_string(), "{}: {} must be a list of strings, got element {}", source_, path(key), json_excerpt(item));
    out.push_back(item.get<std::string>());
  }
}

void JsonFields::read(const std::string& key, std::vector<int64_t>& out) {
  const json* v = get(key, &json::is_array, "a list of integers");
  if (!v) return;
  out.clear();
  for (const json& item : *v) {
    HYLA_CHECK(item.is_number_integer(), "{}: {} must be a list of integers, got element {}", source_, path(key),
               json_excerpt(item));
    out.push_back(item.get<int64_t>());
  }
}

void JsonFields::read(const std::string& key, std::vector<double>& out) {
  const json* v = get(key, &json::is_array, "a list of numbers");
  if (!v) return;
  out.clear();
  for (const json& item : *v) {
    HYLA_CHECK(item.is_number(), "{}: {} must be a list of numbers, got element {}", source_, path(key),
               json_excerpt(item));
    out.push_back(item.get<double>());
  }
}

JsonFields JsonFields::object(const std::string& key) {
  const json* v = get(key, &json::is_object, "an object");
  return JsonFields(v ? *v : kEmpty, source_, path(key));
}

const json& JsonFields::raw(const std::string& key) {
  seen_.insert(key);
  auto it = object_.find(key);
  return it == object_.end() ? kEmpty : *it;
}

void JsonFields::finish() const {
  for (const auto& [key, _] : object_.items())
    HYLA_CHECK(seen_.count(key), "{}: unknown key {}", source_, path(key));
}

void JsonFields::fail_rule(const std::string& message) const { fail("{}: {}", source_, message); }

json parse_json(std::string_view text, std::string_view source) {
  std::vector<std::set<std::string>> open_objects;
  const auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    using event_t = json::parse_event_t;
    if ((event == event_t::object_start || event == event_t::array_start) && depth >= kMaxJsonDepth)
      fail("{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
    if (event == event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == event_t::object_end) {
      open_objects.pop_back();
    } else if (event == event_t::key && !open_objects.back().insert(parsed.get<std::string>()).second) {
      fail("{}: duplicate key '{}'", source, parsed.get<std::string>());
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {  // syntax errors, and numbers out of range
    // nlohmann's text without its "[json.exception.parse_error.101] parse error" prefix.
    std::string_view what = e.what();
    if (const size_t bracket = what.find("] "); what.starts_with("[json.") && bracket != std::string_view::npos)
      what.remove_prefix(bracket + 2);
    if (what.starts_with("parse error at ")) fail("{}: not valid JSON at {}", source, what.substr(15));
    if (what.starts_with("parse error")) what.remove_prefix(std::min(what.size(), size_t(13)));
    fail("{}: not valid JSON: {}", source, what);
  }
}

json parse_json_file(const std::string& path) { return parse_json(read_file(path), path); }

std::string json_excerpt(const json& value, size_t max_chars) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > max_chars) text = text.substr(0, max_chars - 3) + "...";
  return text;
}

}  // namespace hyla
