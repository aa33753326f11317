#pragma once
// Tool environments with verifiable rewards: an Environment makes seeded tasks (Episodes); an
// Episode holds one task's state, runs its tools and judges the final answer exactly. Tasks of the
// train, dev and test splits come from disjoint seed streams with the same parameters; the
// shifted split is harder (more operands, longer documents, more steps) and never trained on.
//
// What crosses this seam: tool calls that passed their schema check (tools.h) in, JSON results
// out, and the final answer's verdict. Never the model, tokens or faults: the agent runtime
// (agent.h) owns those, and asks an episode only for a silently wrong result when a fault says so.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/chat_template.h"
#include "hyla/agent/tools.h"

namespace hyla {

enum class Split : uint8_t { Train, Dev, Test, Shifted };
const char* to_string(Split split);
Split parse_split(std::string_view name);  // "train", "dev", "test", "shifted"

struct Verdict {
  bool correct = false;
  bool well_formed = false;  // the answer has the form the task asks for (a number, an expression, ...)
};

// The expert's next move (demonstrations): a call, or the final answer.
struct ExpertMove {
  bool answer = false;
  ToolCall call;
  std::string text;  // the final answer's text, with answer
};

class Episode {
 public:
  virtual ~Episode() = default;
  virtual const std::string& task() const = 0;  // the user's request
  // Runs a call that passed its schema check. `corrupt`: a silent fault; the result looks like a
  // success but is wrong, and a call with effects has none.
  virtual nlohmann::json run(const std::string& tool, const nlohmann::json& arguments, bool corrupt) = 0;
  // The final reply (after "Answer:" when present); tasks judged on state read the state.
  virtual Verdict judge(std::string_view answer) const = 0;
  // The expert's next move, given the results of its calls so far that did not fail explicitly
  // (a silent fault's wrong result included: the expert trusts its tools like a model would).
  virtual ExpertMove expert(const std::vector<nlohmann::json>& results) const = 0;
  // The same request in another form (the attempt-th, from 1), for a call a permanent fault
  // rejects: each attempt a different call.
  virtual ToolCall rephrase(const ToolCall& call, int attempt) const = 0;
};

class Environment {
 public:
  virtual ~Environment() = default;
  virtual const std::string& name() const = 0;
  virtual const std::vector<Tool>& tools() const = 0;
  // Task `index` of a split; the same (split, index) is always the same task.
  virtual std::unique_ptr<Episode> make(Split split, uint64_t index) const = 0;
};

// "calculator", "lookup", "countdown", "ledger"; an unknown name is an error listing them.
std::unique_ptr<Environment> make_environment(std::string_view name);
const std::vector<std::string>& environment_names();

// The seed of task `index` of a split of an environment: disjoint streams per split.
uint64_t task_seed(std::string_view environment, Split split, uint64_t index);

// The final answer in a reply: the text after the last "Answer:" up to the line's end, trimmed
// (nullopt without one).
std::optional<std::string> extract_answer(std::string_view reply);

}  // namespace hyla
