#include "hyla/eval/agent_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "hyla/core/error.h"
#include "hyla/core/progress.h"

namespace hyla {

using ojson = nlohmann::ordered_json;

namespace {

double choose(int64_t n, int64_t k) {
  if (k < 0 || k > n) return 0;
  double r = 1;
  for (int64_t i = 1; i <= k; ++i) r = r * double(n - k + i) / double(i);
  return r;
}

struct TaskResult {
  int64_t n = 0, c = 0;
};

ojson summarize(const std::vector<const Trajectory*>& episodes) {
  std::map<std::pair<std::string, uint64_t>, TaskResult> tasks;
  double steps = 0, calls = 0, invalid = 0, generated = 0, reward = 0, prompt = 0, cached = 0;
  std::array<int64_t, 4> met{}, recovered{};
  int64_t transient_faults = 0, transient_retried = 0;
  std::map<std::string, int64_t> statuses;
  for (EpisodeStatus s : kEpisodeStatuses) statuses[to_string(s)] = 0;
  for (const Trajectory* t : episodes) {
    TaskResult& r = tasks[{t->environment, t->index}];
    ++r.n;
    r.c += t->correct();
    steps += double(t->steps);
    calls += double(t->tool_calls);
    invalid += double(t->invalid_calls);
    generated += double(t->generated_tokens);
    reward += t->reward;
    prompt += double(t->prompt_tokens);
    cached += double(t->cached_prompt_tokens);
    ++statuses[to_string(t->status)];
    transient_faults += t->faults[0];
    transient_retried += t->transient_retried;
    for (size_t k = 0; k < kFaultKinds.size(); ++k)
      if (t->faults[k] > 0) {
        ++met[k];
        recovered[k] += t->correct();
      }
  }
  const double n = double(std::max<size_t>(1, episodes.size()));
  int64_t trials = tasks.empty() ? 0 : tasks.begin()->second.n;
  for (const auto& [key, r] : tasks) trials = std::min(trials, r.n);
  std::vector<double> per_task;
  for (const auto& [key, r] : tasks) per_task.push_back(double(r.c) / double(r.n));
  double mean = 0, var = 0;
  for (double p : per_task) mean += p;
  mean /= double(std::max<size_t>(1, per_task.size()));
  for (double p : per_task) var += (p - mean) * (p - mean);
  const double T = double(per_task.size());
  const double half = T > 1 ? 1.959964 * std::sqrt(var / (T - 1) / T) : 1.0;
  ojson out = {{"tasks", tasks.size()},
               {"episodes", episodes.size()},
               {"trials", trials},
               {"pass@1", mean},
               {"pass@1_interval", {std::max(0.0, mean - half), std::min(1.0, mean + half)}}};
  ojson pass_all = ojson::object(), pass_any = ojson::object();
  std::vector<int64_t> ks;
  for (int64_t k = 1; k <= trials; k = k < 4 ? k + 1 : 2 * k) ks.push_back(k);
  if (!ks.empty() && ks.back() != trials) ks.push_back(trials);
  for (int64_t k : ks) {
    double all = 0, any = 0;
    for (const auto& [key, r] : tasks) {
      all += pass_all_k(r.n, r.c, k);
      any += pass_any_k(r.n, r.c, k);
    }
    pass_all[fmt::format("{}", k)] = all / T;
    pass_any[fmt::format("{}", k)] = any / T;
  }
  out["pass^k"] = pass_all;
  out["pass@k"] = pass_any;
  out["mean_reward"] = reward / n;
  out["mean_steps"] = steps / n;
  out["mean_tool_calls"] = calls / n;
  out["invalid_call_rate"] = calls > 0 ? invalid / calls : 0.0;
  out["mean_generated_tokens"] = generated / n;
  out["cached_prompt_share"] = prompt > 0 ? cached / prompt : 0.0;
  ojson recovery = ojson::object();
  for (size_t k = 0; k < kFaultKinds.size(); ++k)
    recovery[to_string(kFaultKinds[k])] = {{"episodes", met[k]},
                                          {"recovered", recovered[k]},
                                          {"rate", met[k] > 0 ? ojson(double(recovered[k]) / double(met[k])) : ojson(nullptr)}};
  out["recovery"] = recovery;
  out["transient_retry"] = {
      {"faults", transient_faults},
      {"retried", transient_retried},
      {"rate", transient_faults > 0 ? ojson(double(transient_retried) / double(transient_faults)) : ojson(nullptr)}};
  ojson guardrails = ojson::object();
  for (EpisodeStatus s : kEpisodeStatuses) guardrails[to_string(s)] = statuses[to_string(s)];
  out["status"] = guardrails;
  return out;
}

}  // namespace

double pass_all_k(int64_t n, int64_t c, int64_t k) { return n < k ? 0.0 : choose(c, k) / choose(n, k); }
double pass_any_k(int64_t n, int64_t c, int64_t k) { return n < k ? 0.0 : 1.0 - choose(n - c, k) / choose(n, k); }

std::vector<Trajectory> play_agent_tasks(Model& model, const Tokenizer& tokenizer, const AgentEvalOptions& o) {
  HYLA_CHECK(o.tasks >= 1 && o.trials >= 1, "agent evaluation: --tasks and --trials must be at least 1");
  EngineOptions engine = o.engine;
  engine.context = std::max(engine.context, o.limits.context);
  Scheduler scheduler(model, tokenizer, engine);
  std::vector<std::unique_ptr<Environment>> envs;
  for (const std::string& name : o.environments) envs.push_back(make_environment(name));
  std::vector<Trajectory> out;
  const int64_t total = int64_t(envs.size()) * o.tasks * o.trials;
  std::optional<Progress> progress;
  if (o.progress) progress.emplace("agent episodes", uint64_t(total), "episodes");
  // Batches of whole tasks (all their trials), as many episodes as the engine has slots.
  const int64_t per_batch = std::max<int64_t>(1, engine.max_sequences / o.trials) * o.trials;
  for (const auto& env : envs) {
    for (int64_t first = 0; first < o.tasks * o.trials; first += per_batch) {
      std::vector<AgentSession> sessions;
      for (int64_t e = first; e < std::min(first + per_batch, o.tasks * o.trials); ++e)
        sessions.emplace_back(*env, o.split, uint64_t(e / o.trials), o.faults, o.limits, tokenizer);
      SamplingParams s = o.sampling;
      s.seed = o.sampling.seed + uint64_t(first) * 7919;  // run_agents varies it per session and turn
      run_agents(scheduler, sessions, s);
      for (AgentSession& session : sessions) out.push_back(session.take());
      if (progress) progress->advance(sessions.size());
    }
  }
  if (progress) progress->finish();
  return out;
}

ojson summarize_agent_episodes(const std::vector<Trajectory>& episodes) {
  std::map<std::string, std::vector<const Trajectory*>> by_env;
  std::vector<const Trajectory*> all;
  for (const Trajectory& t : episodes) {
    by_env[t.environment].push_back(&t);
    all.push_back(&t);
  }
  ojson out = ojson::object();
  for (const auto& [name, list] : by_env) out[name] = summarize(list);
  out["all"] = summarize(all);
  return out;
}

}  // namespace hyla
