#include "hyla/agent/environment.h"

#include <fmt/format.h>

#include "hyla/core/error.h"
#include "hyla/core/random.h"

namespace hyla {

// One per file: env_calculator.cpp, env_lookup.cpp, env_countdown.cpp, env_ledger.cpp.
std::unique_ptr<Environment> make_calculator_environment();
std::unique_ptr<Environment> make_lookup_environment();
std::unique_ptr<Environment> make_countdown_environment();
std::unique_ptr<Environment> make_ledger_environment();

const char* to_string(Split split) {
  switch (split) {
    case Split::Train: return "train";
    case Split::Dev: return "dev";
    case Split::Test: return "test";
    case Split::Shifted: return "shifted";
  }
  return "?";
}

Split parse_split(std::string_view name) {
  for (Split s : {Split::Train, Split::Dev, Split::Test, Split::Shifted})
    if (name == to_string(s)) return s;
  fail("unknown split '{}' (the splits are train, dev, test, shifted)", name);
}

const std::vector<std::string>& environment_names() {
  static const std::vector<std::string> names = {"calculator", "lookup", "countdown", "ledger"};
  return names;
}

std::unique_ptr<Environment> make_environment(std::string_view name) {
  if (name == "calculator") return make_calculator_environment();
  if (name == "lookup") return make_lookup_environment();
  if (name == "countdown") return make_countdown_environment();
  if (name == "ledger") return make_ledger_environment();
  fail("unknown environment '{}' (the environments are {})", name, fmt::join(environment_names(), ", "));
}

uint64_t task_seed(std::string_view environment, Split split, uint64_t index) {
  uint64_t state = hash_string(environment) ^ (uint64_t(split) << 56) ^ index;
  splitmix64(state);
  return splitmix64(state);
}

std::optional<std::string> extract_answer(std::string_view reply) {
  const size_t at = reply.rfind("Answer:");
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = reply.substr(at + 7);
  rest = rest.substr(0, rest.find('\n'));
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) rest.remove_prefix(1);
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.remove_suffix(1);
  return std::string(rest);
}

}  // namespace hyla
