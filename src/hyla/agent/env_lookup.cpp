// Key-value lookup in a document the model never sees whole: 300 records (shifted: 3000), each
// "key = value" with a 7-digit value; similar keys (same words, another number) are distractors.
// The agent finds the key's line with `search` (substring match, line numbers only) and reads it
// with `read`.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "hyla/core/random.h"
#include "hyla/agent/tool_environment.h"

namespace hyla {
namespace {

using json = nlohmann::json;

constexpr const char* kWords[] = {"amber", "birch", "cedar", "delta", "ember", "falcon", "garnet", "harbor",
                                  "iris",  "jade",  "kestrel", "lunar", "maple", "nectar", "onyx",  "pepper",
                                  "quartz", "raven", "saffron", "tundra", "umber", "violet", "willow", "zephyr"};
constexpr size_t kWordCount = std::size(kWords);
constexpr int64_t kMaxMatches = 5;
constexpr int kAttempts = 3;  // the expert's searches for one key

class LookupEpisode final : public Episode {
 public:
  LookupEpisode(Split split, uint64_t seed) {
    Rng rng(seed);
    const int64_t n = split == Split::Shifted ? 3000 : 300;
    std::set<std::string> used;
    while (int64_t(lines_.size()) < n) {
      const std::string key = fmt::format("{}-{}-{}", kWords[rng.below(kWordCount)], kWords[rng.below(kWordCount)],
                                          10 + rng.below(90));
      if (!used.insert(key).second) continue;
      keys_.push_back(key);
      values_.push_back(1000000 + int64_t(rng.below(9000000)));
      lines_.push_back(fmt::format("{} = {}", key, values_.back()));
    }
    target_ = int64_t(rng.below(uint64_t(n)));
    task_ = fmt::format("A document of {} lines holds records \"key = value\". What is the value of {}?", n, keys_[size_t(target_)]);
    rng_ = Rng(seed ^ 0x5eed);
  }
  const std::string& task() const override { return task_; }

  json run(const std::string& tool, const json& arguments, bool corrupt) override {
    const int64_t n = int64_t(lines_.size());
    if (tool == "search") {
      const std::string query = arguments.at("query").get<std::string>();
      if (query.size() < 3) return {{"error", "the query must have at least 3 characters"}};
      json found = json::array();
      for (int64_t i = 0; i < n && int64_t(found.size()) < kMaxMatches; ++i)
        if (lines_[size_t(i)].find(query) != std::string::npos) found.push_back(i + 1);
      if (corrupt) found = json::array({1 + int64_t(rng_.below(uint64_t(n)))});
      return {{"lines", found}};
    }
    const int64_t line = arguments.at("line").get<int64_t>();
    const int64_t count = arguments.value("count", int64_t(1));
    if (line < 1 || line > n) return {{"error", fmt::format("there is no line {} (the document has {})", line, n)}};
    json text = json::array();
    for (int64_t i = line; i < std::min(n + 1, line + count); ++i)
      text.push_back(lines_[size_t(corrupt ? int64_t(rng_.below(uint64_t(n))) : i - 1)]);
    return {{"line", line}, {"text", text}};
  }

  Verdict judge(std::string_view answer) const override {
    const bool digits = !answer.empty() && std::all_of(answer.begin(), answer.end(), [](char c) { return c >= '0' && c <= '9'; });
    return {digits && answer == std::to_string(values_[size_t(target_)]), digits};
  }

  // The expert checks what it reads: a line that does not hold the key it asked for is a silently
  // wrong result (of the search or of the read), so it searches again in another form and reads
  // more lines (calls it has not made, which a permanent fault does not follow). Its successful
  // results come in (search, read) pairs, one pair per attempt.
  ExpertMove expert(const std::vector<json>& results) const override {
    const std::string& key = keys_[size_t(target_)];
    int attempt = 0;
    for (size_t i = 0; i + 1 < results.size(); i += 2, ++attempt)
      for (const json& line : results[i + 1].value("text", json::array()))
        if (const std::string s = line.get<std::string>(); s.rfind(key + " = ", 0) == 0)
          return {true, {}, "Answer: " + s.substr(key.size() + 3)};
    if (attempt == kAttempts) return {true, {}, "Answer: not found"};
    const ToolCall search{"search", json{{"query", key}}.dump()};
    if (results.size() % 2 == 0) return {false, attempt == 0 ? search : rephrase(search, attempt), {}};
    const json& lines = results.back().value("lines", json::array());
    if (lines.empty()) return {true, {}, "Answer: not found"};
    json read = {{"line", lines[0]}};
    if (attempt > 0) read["count"] = 1 + attempt;
    return {false, {"read", read.dump()}, {}};
  }

  ToolCall rephrase(const ToolCall& call, int attempt) const override {
    json args = json::parse(call.arguments);
    const std::string query = call.name == "search" ? args.at("query").get<std::string>() : "";
    // The key then " =", the key then " ", then the key less its first letters (still unique).
    if (call.name == "search") args["query"] = attempt == 1 ? query + " =" : attempt == 2 ? query + " " : query.substr(size_t(std::min(attempt - 2, 4)));
    else args["count"] = std::min<int64_t>(5, args.value("count", int64_t(1)) + attempt);
    return {call.name, args.dump()};
  }

 private:
  std::vector<std::string> keys_, lines_;
  std::vector<int64_t> values_;
  int64_t target_ = 0;
  std::string task_;
  Rng rng_;
};

}  // namespace

std::unique_ptr<Environment> make_lookup_environment() {
  std::vector<Tool> tools;
  tools.push_back({"search", "Find the lines of the document that contain a text; returns up to 5 line numbers.",
                   {{"type", "object"},
                    {"properties", {{"query", {{"type", "string"}}}}},
                    {"required", {"query"}},
                    {"additionalProperties", false}}});
  tools.push_back({"read", "Read lines of the document, from a line number (1-based).",
                   {{"type", "object"},
                    {"properties", {{"line", {{"type", "integer"}, {"minimum", 1}}},
                                    {"count", {{"type", "integer"}, {"minimum", 1}, {"maximum", 5}}}}},
                    {"required", {"line"}},
                    {"additionalProperties", false}}});
  return std::make_unique<ToolEnvironment<LookupEpisode>>("lookup", std::move(tools));
}

}  // namespace hyla
