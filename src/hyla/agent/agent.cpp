#include "hyla/agent/agent.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

namespace hyla {

using json = nlohmann::json;

namespace {

constexpr const char* kInstructions =
    "Solve the user's task with the tools. Call one tool per turn; when the task is done, reply "
    "with \"Answer: \" followed by the answer.";

}  // namespace

ChatOptions chat_options(const Environment& environment) {
  ChatOptions options;
  options.compact_tools = true;  // one line per tool: demonstrations a small model can learn fit ~256 tokens
  for (const Tool& tool : environment.tools()) options.tools.push_back(tool.definition());
  return options;
}

const char* to_string(EpisodeStatus status) {
  switch (status) {
    case EpisodeStatus::Answered: return "answered";
    case EpisodeStatus::Abstained: return "abstained";
    case EpisodeStatus::GaveUp: return "gave_up";
    case EpisodeStatus::StepBudget: return "step_budget";
    case EpisodeStatus::TokenBudget: return "token_budget";
    case EpisodeStatus::TimeBudget: return "time_budget";
    case EpisodeStatus::ContextFull: return "context_full";
  }
  return "?";
}

json AgentLimits::to_json() const {
  json j = {{"max_steps", max_steps},         {"max_tokens", max_tokens},
            {"max_turn_tokens", max_turn_tokens}, {"max_seconds", max_seconds},
            {"context", context},             {"max_consecutive_failures", max_consecutive_failures},
            {"format_reward", format_reward}};
  j["min_confidence"] = std::isfinite(min_confidence) ? json(min_confidence) : json(nullptr);
  return j;
}

AgentLimits AgentLimits::from_json(const json& j, const std::string& source) {
  AgentLimits l;
  JsonFields f(j, source, "limits");
  f.read("max_steps", l.max_steps);
  f.read("max_tokens", l.max_tokens);
  f.read("max_turn_tokens", l.max_turn_tokens);
  f.read("max_seconds", l.max_seconds);
  f.read("context", l.context);
  f.read("max_consecutive_failures", l.max_consecutive_failures);
  if (f.has("min_confidence") && !f.raw("min_confidence").is_null()) f.read("min_confidence", l.min_confidence);
  else f.ignore("min_confidence");
  f.read("format_reward", l.format_reward);
  f.finish();
  if (l.max_steps < 1 || l.max_tokens < 1 || l.max_turn_tokens < 1 || l.max_consecutive_failures < 1)
    f.fail_rule("max_steps, max_tokens, max_turn_tokens and max_consecutive_failures must be at least 1");
  if (!(l.max_seconds > 0) || l.context < 16) f.fail_rule("max_seconds must be positive and context at least 16");
  if (!(l.format_reward >= 0 && l.format_reward < 1)) f.fail_rule("format_reward must be in [0, 1)");
  return l;
}

json Trajectory::summary() const {
  json faults_json = json::object();
  for (size_t k = 0; k < kFaultKinds.size(); ++k) faults_json[to_string(kFaultKinds[k])] = faults[k];
  return {{"environment", environment},
          {"split", to_string(split)},
          {"index", index},
          {"status", to_string(status)},
          {"correct", correct()},
          {"well_formed", verdict.well_formed},
          {"reward", reward},
          {"confidence", confidence},
          {"steps", steps},
          {"tool_calls", tool_calls},
          {"invalid_calls", invalid_calls},
          {"failed_calls", failed_calls},
          {"generated_tokens", generated_tokens},
          {"tokens", ids.size()},
          {"prompt_tokens", prompt_tokens},
          {"cached_prompt_tokens", cached_prompt_tokens},
          {"faults", faults_json},
          {"transient_retried", transient_retried},
          {"seconds", seconds}};
}

std::vector<int32_t> encode_assistant_reply(const Tokenizer& tokenizer, const ChatMessage& reply) {
  // The assistant turn, less its "<|im_start|>assistant\n" and the "\n" after <|im_end|>.
  const ChatTemplate chat(tokenizer, ChatFormat::Hyla);
  const std::vector<ChatMessage> one{reply};
  std::vector<int32_t> ids = chat.encode(one);
  const size_t header = chat.encode({}, true).size();
  const size_t newline = tokenizer.encode("\n").size();
  HYLA_ASSERT(ids.size() > header + newline);
  return {ids.begin() + int64_t(header), ids.end() - int64_t(newline)};
}

AgentSession::AgentSession(const Environment& environment, Split split, uint64_t index, const FaultConfig& faults,
                           const AgentLimits& limits, const Tokenizer& tokenizer)
    : environment_(environment),
      episode_(environment.make(split, index)),
      faults_(faults, task_seed(environment.name(), split, index) ^ 0xfa017),
      limits_(limits),
      tokenizer_(tokenizer),
      chat_(tokenizer, ChatFormat::Hyla),
      started_(std::chrono::steady_clock::now()),
      end_id_(tokenizer.special_id("<|im_end|>")),
      start_id_(tokenizer.special_id("<|im_start|>")) {
  t_.environment = environment.name();
  t_.split = split;
  t_.index = index;
  t_.messages = {{"system", kInstructions, {}, {}, {}}, {"user", episode_->task(), {}, {}, {}}};
  t_.ids = chat_.encode(t_.messages, true, chat_options(environment));
  t_.sampled.assign(t_.ids.size(), 0);
  t_.logprobs.assign(t_.ids.size(), 0.0f);
  if (int64_t(t_.ids.size()) >= limits_.context) end(EpisodeStatus::ContextFull);
}

int64_t AgentSession::reply_limit() const {
  return std::max<int64_t>(1, std::min({limits_.max_turn_tokens, limits_.max_tokens - t_.generated_tokens,
                                        limits_.context - int64_t(t_.ids.size())}));
}

bool AgentSession::over_time() const { return seconds_since(started_) > limits_.max_seconds; }

void AgentSession::time_out() {
  HYLA_ASSERT(!done_);
  end(EpisodeStatus::TimeBudget);
}

void AgentSession::count_prompt(int64_t tokens, int64_t cached) {
  t_.prompt_tokens += tokens;
  t_.cached_prompt_tokens += cached;
}

void AgentSession::append_text(const std::string& text) {
  const std::vector<int32_t> ids = tokenizer_.encode(text);
  t_.ids.insert(t_.ids.end(), ids.begin(), ids.end());
  t_.sampled.resize(t_.ids.size(), 0);
  t_.logprobs.resize(t_.ids.size(), 0.0f);
}

void AgentSession::end(EpisodeStatus status) {
  done_ = true;
  t_.status = status;
  t_.seconds = seconds_since(started_);
  if (status != EpisodeStatus::Answered) t_.verdict.correct = false;
  t_.reward = status != EpisodeStatus::Answered ? 0.0
              : t_.verdict.correct             ? 1.0
              : t_.verdict.well_formed         ? limits_.format_reward
                                               : 0.0;
}

void AgentSession::observe(const ToolCall& call) {
  ++t_.tool_calls;
  json observation;
  const CheckedCall checked = check_call(environment_.tools(), call);
  if (!checked.tool) {
    ++t_.invalid_calls;
    observation = {{"error", "invalid call: " + checked.error}};
  } else {
    const std::string call_key = call.name + " " + checked.arguments.dump();
    t_.transient_retried += int64_t(awaiting_retry_.erase(call_key));
    const FaultKind fault = faults_.next(call_key);
    if (fault == FaultKind::ExplicitTransient) awaiting_retry_.insert(call_key);
    if (fault != FaultKind::None)
      ++t_.faults[size_t(std::find(kFaultKinds.begin(), kFaultKinds.end(), fault) - kFaultKinds.begin())];
    if (fault == FaultKind::ExplicitTransient) observation = {{"error", kTransientFaultError}};
    else if (fault == FaultKind::ExplicitPermanent) observation = {{"error", kPermanentFaultError}};
    else observation = episode_->run(call.name, checked.arguments, fault != FaultKind::None);
  }
  append_observation(observation);
}

void AgentSession::append_observation(const json& observation) {
  const bool failed = failed_observation(observation);
  t_.failed_calls += failed;
  failures_.record(failed);
  last_observations_.push_back(observation);
  const std::vector<ChatMessage> one{{"tool", observation.dump(), {}, {}, {}}};
  const std::vector<int32_t> ids = chat_.encode(one);
  t_.ids.insert(t_.ids.end(), ids.begin(), ids.end());
  t_.sampled.resize(t_.ids.size(), 0);
  t_.logprobs.resize(t_.ids.size(), 0.0f);
  t_.messages.push_back(one[0]);
}

void AgentSession::reply(std::span<const int32_t> ids, std::span<const double> logprobs) {
  HYLA_ASSERT(!done_ && !ids.empty() && (logprobs.empty() || logprobs.size() == ids.size()));
  t_.ids.insert(t_.ids.end(), ids.begin(), ids.end());
  t_.sampled.resize(t_.ids.size(), 1);
  for (size_t i = 0; i < ids.size(); ++i) t_.logprobs.push_back(logprobs.empty() ? 0.0f : float(logprobs[i]));
  t_.generated_tokens += int64_t(ids.size());
  ++t_.steps;
  const bool closed = ids.back() == end_id_;
  if (!closed) {  // cut short by a budget: the turn is closed for the policy
    t_.ids.push_back(end_id_);
    t_.sampled.push_back(0);
    t_.logprobs.push_back(0.0f);
  }
  append_text("\n");
  const std::string text = tokenizer_.decode(closed ? ids.first(ids.size() - 1) : ids);
  const AssistantReply parsed = chat_.parse_reply(text, chat_options(environment_));
  t_.messages.push_back({"assistant", parsed.content, parsed.tool_calls, {}, {}});
  last_observations_.clear();

  const bool malformed_call = parsed.malformed_call;
  if (!parsed.tool_calls.empty() || malformed_call) {
    for (const ToolCall& call : parsed.tool_calls) observe(call);
    if (malformed_call) {
      ++t_.tool_calls;
      ++t_.invalid_calls;
      append_observation({{"error", std::string("invalid call: ") + kMalformedCallError}});
    }
    if (failures_.reached(limits_.max_consecutive_failures)) return end(EpisodeStatus::GaveUp);
    if (t_.steps >= limits_.max_steps) return end(EpisodeStatus::StepBudget);
    if (t_.generated_tokens >= limits_.max_tokens) return end(EpisodeStatus::TokenBudget);
    if (over_time()) return end(EpisodeStatus::TimeBudget);
    t_.ids.push_back(start_id_);
    t_.sampled.push_back(0);
    t_.logprobs.push_back(0.0f);
    append_text("assistant\n");
    if (int64_t(t_.ids.size()) + 1 >= limits_.context) return end(EpisodeStatus::ContextFull);
    return;
  }
  // A final reply.
  if (over_time()) return end(EpisodeStatus::TimeBudget);
  if (!closed && t_.generated_tokens >= limits_.max_tokens) return end(EpisodeStatus::TokenBudget);
  if (!closed && int64_t(t_.ids.size()) >= limits_.context) return end(EpisodeStatus::ContextFull);
  t_.confidence = mean_logprob(logprobs);
  const std::optional<std::string> answer = extract_answer(parsed.content);
  t_.verdict = episode_->judge(answer.value_or(""));
  if (!answer) t_.verdict.well_formed = false;
  if (below_confidence(t_.confidence, limits_.min_confidence)) return end(EpisodeStatus::Abstained);
  end(EpisodeStatus::Answered);
}

void run_agents(Scheduler& scheduler, std::span<AgentSession> sessions, const SamplingParams& sampling) {
  std::map<Scheduler::RequestId, size_t> in_flight;
  std::vector<int64_t> turns(sessions.size(), 0);
  // Sessions that open with the same prompt (a group's rollouts) wait for the first of them to read
  // it: the scheduler keeps a snapshot before a prompt's last token, which they then restore whole,
  // so the group reads its prompt once. They are released at the leader's first generated text (or
  // its reply's end, if no text came), not after its whole first reply: the group decodes together.
  std::map<std::vector<int32_t>, size_t> leader_of;
  std::map<size_t, std::vector<size_t>> waiting_on;  // leader -> the sessions its prompt's snapshot releases
  std::vector<uint8_t> prompt_read(sessions.size(), 0);
  auto submit = [&](size_t j) {
    GenerationRequest request;
    request.prompt = sessions[j].ids();
    request.max_tokens = sessions[j].reply_limit();
    request.sampling = sampling;
    request.sampling.seed = sampling.seed + 1000003 * j + uint64_t(turns[j]++);
    request.logprobs = true;
    const AgentSession* session = &sessions[j];
    request.is_cancelled = [session] { return session->over_time(); };  // the wall-clock budget, mid-turn too
    if (waiting_on.contains(j))
      request.on_text = [&prompt_read, j](std::string_view) {
        prompt_read[j] = 1;
        return true;
      };
    in_flight[scheduler.add(std::move(request))] = j;
  };
  auto release = [&](size_t leader) {
    const auto released = waiting_on.find(leader);
    if (released == waiting_on.end()) return;
    const std::vector<size_t> followers = std::move(released->second);
    waiting_on.erase(released);
    for (size_t k : followers) submit(k);
  };
  std::vector<size_t> leaders;
  for (size_t j = 0; j < sessions.size(); ++j) {
    if (sessions[j].done()) continue;
    const auto [it, first] = leader_of.try_emplace(sessions[j].ids(), j);
    if (first) leaders.push_back(j);
    else waiting_on[it->second].push_back(j);
  }
  for (size_t j : leaders) submit(j);
  while (!in_flight.empty()) {
    for (Scheduler::Finished& f : scheduler.step()) {
      const auto it = in_flight.find(f.id);
      if (it == in_flight.end()) continue;
      const size_t j = it->second;
      in_flight.erase(it);
      if (f.error) std::rethrow_exception(f.error);
      AgentSession& s = sessions[j];
      s.count_prompt(f.output.prompt_tokens, f.output.cached_prompt_tokens);
      if (f.output.finish_reason == FinishReason::Cancelled) s.time_out();
      else s.reply(f.output.tokens, f.output.token_logprobs);
      if (!s.done()) submit(j);
      release(j);
    }
    for (size_t j = 0; j < sessions.size(); ++j)
      if (prompt_read[j]) {
        prompt_read[j] = 0;
        release(j);
      }
  }
}

void run_expert(AgentSession& session) {
  const Tokenizer& tokenizer = session.tokenizer();
  std::vector<json> results;  // what the expert's calls returned, errors of faults excluded
  std::optional<ToolCall> pending, planned;  // the call to make now, and the expert's form of it
  int rephrased = 0;
  while (!session.done()) {
    ChatMessage reply{"assistant", "", {}, {}};
    if (pending) {
      reply.tool_calls.push_back(*pending);
    } else {
      const ExpertMove move = session.episode().expert(results);
      if (move.answer) reply.content = move.text;
      else reply.tool_calls.push_back(move.call);
      planned = move.call;
      rephrased = 0;
    }
    session.reply(encode_assistant_reply(tokenizer, reply), {});
    if (reply.tool_calls.empty() || session.done()) break;
    const json& observation = session.last_observations().at(0);
    const std::string error = observation.value("error", "");
    if (error == kTransientFaultError) pending = reply.tool_calls[0];
    else if (error == kPermanentFaultError) pending = session.episode().rephrase(*planned, ++rephrased);
    else {
      pending.reset();
      results.push_back(observation);
    }
  }
}

}  // namespace hyla
