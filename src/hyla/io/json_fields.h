#pragma once
// Strict reading of JSON objects for configuration files: every key read is type-checked, a key
// nobody reads is an error, and errors name the key by its dotted path (e.g. "moe.num_experts").
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "hyla/core/error.h"

namespace hyla {

class JsonFields {
 public:
  // `source` names the file for messages; `prefix` is the dotted path of this object ("" at the top).
  JsonFields(const nlohmann::json& object, std::string source, std::string prefix = "");

  bool has(const std::string& key) const { return object_.contains(key); }
  std::string path(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

  // Reads `key` into `out` if present; leaves `out` (its default) untouched otherwise.
  void read(const std::string& key, bool& out);
  void read(const std::string& key, int64_t& out);
  void read(const std::string& key, double& out);
  void read(const std::string& key, std::string& out);
  void read(const std::string& key, std::vector<std::string>& out);
  void read(const std::string& key, std::vector<int64_t>& out);
  // Marks keys as known but ignored (bookkeeping keys written by other tools).
  void ignore(const std::string& key) { seen_.insert(key); }
  // A nested object; absent keys give an empty object.
  JsonFields object(const std::string& key);
  const nlohmann::json& raw(const std::string& key);
  // Fails on the first key that was never read.
  void finish() const;
  [[noreturn]] void fail_rule(const std::string& message) const;

 private:
  const nlohmann::json* get(const std::string& key, bool (nlohmann::json::*is)() const noexcept,
                            const char* type_name);
  const nlohmann::json& object_;
  std::string source_, prefix_;
  std::set<std::string> seen_;
  static const nlohmann::json kEmpty;
};

// Parses a JSON file with a one-line error naming the file on failure.
nlohmann::json parse_json_file(const std::string& path);

}  // namespace hyla
