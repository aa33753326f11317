#pragma once
// The agent runtime shared by `hyla agent`, `hyla rl` and `hyla eval agent`: one episode as a
// conversation in SPEC §8's chat format (system turn offering the tools, the user's task, then
// assistant turns and tool observations), with the guardrails (their rules are
// guardrails.h's, which `hyla serve` applies too):
// - budgets: assistant turns, generated tokens, wall-clock seconds, and the context;
// - every tool call checked against its schema before it runs (tools.h); an invalid one becomes an
//   error observation and is counted;
// - faults injected into calls (faults.h), always returned as observations;
// - a fallback after N tool calls in a row failed (invalid, or an error observation): the episode
//   ends with status gave_up;
// - a confidence threshold: a final reply whose mean token log-probability is below it abstains.
//
// The session holds the token ids exactly as the policy produced them (a model's sampled ids are
// never re-tokenised), which rows the policy wrote, and their log-probabilities: what an RL update
// needs. Policies drive it from outside: a model through the Scheduler (run_agents, every
// trajectory's prompt state reused across its turns by the prefix cache), or the expert
// (run_expert) for demonstrations.
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "hyla/core/clock.h"
#include "hyla/data/chat_template.h"
#include "hyla/data/tokenizer.h"
#include "hyla/infer/scheduler.h"
#include "hyla/agent/environment.h"
#include "hyla/agent/faults.h"
#include "hyla/agent/guardrails.h"

namespace hyla {

struct AgentLimits {
  int64_t max_steps = 8;            // assistant turns
  int64_t max_tokens = 512;         // generated over the episode
  int64_t max_turn_tokens = 128;    // generated in one turn
  double max_seconds = 300;         // wall clock
  int64_t context = 2048;           // tokens of the whole conversation
  int64_t max_consecutive_failures = 3;
  double min_confidence = -std::numeric_limits<double>::infinity();  // mean log-prob of the final reply
  // Reward: 1 for a correct answer, this for a well-formed wrong one, 0 otherwise and over budget.
  double format_reward = 0.1;
  nlohmann::json to_json() const;
  static AgentLimits from_json(const nlohmann::json& j, const std::string& source);
};

enum class EpisodeStatus : uint8_t { Answered, Abstained, GaveUp, StepBudget, TokenBudget, TimeBudget, ContextFull };
inline constexpr EpisodeStatus kEpisodeStatuses[] = {EpisodeStatus::Answered,    EpisodeStatus::Abstained,
                                                     EpisodeStatus::GaveUp,      EpisodeStatus::StepBudget,
                                                     EpisodeStatus::TokenBudget, EpisodeStatus::TimeBudget,
                                                     EpisodeStatus::ContextFull};
const char* to_string(EpisodeStatus status);  // "answered", "abstained", "gave_up", "step_budget", ...

struct Trajectory {
  std::string environment;
  Split split = Split::Train;
  uint64_t index = 0;
  std::vector<int32_t> ids;       // the whole conversation
  std::vector<uint8_t> sampled;   // [ids] 1 where the policy wrote the id
  std::vector<float> logprobs;    // [ids] the policy's log-probability of a sampled id (0 elsewhere)
  std::vector<ChatMessage> messages;
  EpisodeStatus status = EpisodeStatus::Answered;
  Verdict verdict;
  double reward = 0, confidence = 0;
  int64_t steps = 0, tool_calls = 0, invalid_calls = 0, failed_calls = 0, generated_tokens = 0;
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0;  // read by the model over the turns, and of those restored from the prefix cache
  std::array<int64_t, 4> faults{};  // calls that met each kind (kFaultKinds' order)
  int64_t transient_retried = 0;    // explicit transient faults whose call the policy made again (a retry works)
  double seconds = 0;
  bool correct() const { return verdict.correct && status == EpisodeStatus::Answered; }
  nlohmann::json summary() const;  // counters and outcome, one metrics line
};

class AgentSession {
 public:
  AgentSession(const Environment& environment, Split split, uint64_t index, const FaultConfig& faults,
               const AgentLimits& limits, const Tokenizer& tokenizer);
  bool done() const { return done_; }
  // The conversation so far; while not done it ends with an open assistant turn.
  const std::vector<int32_t>& ids() const { return t_.ids; }
  // The most tokens the next reply may have (turn, episode and context budgets).
  int64_t reply_limit() const;
  // The policy's reply: its ids (ending in <|im_end|> unless cut short) and their log-probabilities.
  void reply(std::span<const int32_t> ids, std::span<const double> logprobs);
  // The wall-clock budget is spent; time_out() ends the episode so (a turn cancelled for it).
  bool over_time() const;
  void time_out();
  // Prompt tokens the model read for the last reply, and how many came from cached state.
  void count_prompt(int64_t tokens, int64_t cached);
  const Trajectory& trajectory() const { return t_; }
  Trajectory take() { return std::move(t_); }
  Episode& episode() { return *episode_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  // The observations the last reply's calls got, in order.
  const std::vector<nlohmann::json>& last_observations() const { return last_observations_; }

 private:
  void observe(const ToolCall& call);
  void append_observation(const nlohmann::json& observation);  // a tool turn, counted as failed when it holds an error
  void end(EpisodeStatus status);
  void append_text(const std::string& text);

  const Environment& environment_;
  std::unique_ptr<Episode> episode_;
  FaultInjector faults_;
  AgentLimits limits_;
  const Tokenizer& tokenizer_;
  ChatTemplate chat_;  // hyla's format, whatever the tokenizer
  std::chrono::steady_clock::time_point started_;
  Trajectory t_;
  FailureStreak failures_;
  bool done_ = false;
  int32_t end_id_, start_id_;
  std::vector<nlohmann::json> last_observations_;
  std::set<std::string> awaiting_retry_;  // calls an explicit transient fault answered, not yet made again
};

// An episode's chat options: the environment's tools, offered in the system turn one line each
// (ChatOptions::compact_tools). SFT demonstrations, RL, `hyla eval agent` and `hyla agent` all
// build their prompts here, so every one sees the same prompt.
ChatOptions chat_options(const Environment& environment);

// The ids of an assistant reply as hyla's chat format lays them out after "<|im_start|>assistant\n":
// the content, each call in its <tool_call> block, and <|im_end|>.
std::vector<int32_t> encode_assistant_reply(const Tokenizer& tokenizer, const ChatMessage& reply);

// Drives the sessions with a model: each open turn becomes a request (the conversation as the
// prompt, logprobs on), all sessions batched together until every one is done; sessions opening
// with the same prompt start once the first of them has read it (then they restore it from the
// prefix cache). Session j's turn k samples with seed sampling.seed + 1000003·j + k.
void run_agents(Scheduler& scheduler, std::span<AgentSession> sessions, const SamplingParams& sampling);

// Drives a session with the environment's expert: retries a call that timed out, rephrases one that
// was rejected, and leaves the rest to the episode's expert, which checks what its observations
// let it check (lookup: the line read holds the key) and trusts the rest.
void run_expert(AgentSession& session);

}  // namespace hyla
