#pragma once
// Strict reading of JSON objects for configuration files: every key read is type-checked, a key
// nobody reads is an error, and errors name the key by its dotted path (e.g. "moe.num_experts").
#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <string_view>
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
  void read(const std::string& key, std::vector<double>& out);
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

// The deepest nesting a JSON document may have. nlohmann parses iteratively, but copying, comparing
// and printing a value recurse once per level, so 100k nested arrays would overflow a thread's stack.
inline constexpr int kMaxJsonDepth = 64;

// Every JSON document hyla reads (files, request bodies, headers) goes through here: text that is
// not JSON, nesting deeper than kMaxJsonDepth and a key repeated in one object (nlohmann would keep
// the last silently) are errors whose one-line message starts with `source`.
nlohmann::json parse_json(std::string_view text, std::string_view source);
nlohmann::json parse_json_file(const std::string& path);

// A value quoted in an error message: its JSON text, cut to at most `max_chars` characters.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 60);

}  // namespace hyla
