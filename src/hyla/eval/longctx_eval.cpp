#include "hyla/eval/longctx_eval.h"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/resource.h>

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "hyla/core/clock.h"
#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/infer/scheduler.h"
#include "hyla/infer/sequence_state.h"

namespace hyla {
namespace {

// One sample to ask: its cell, how to make it, and the answer's budget. Samples are made when they
// are submitted and dropped when answered, so a length holds only the prompts in flight (a
// million-token prompt is 4 MB of ids).
struct Job {
  size_t cell;
  std::function<LongCtxSample()> make;
  int64_t max_tokens;
};
using Answered = std::function<void(const Job&, const LongCtxSample&, const std::string& output, int64_t generated)>;

// Answers prompts greedily: the local model through a scheduler, or a `hyla serve` over HTTP.
class Answerer {
 public:
  virtual ~Answerer() = default;
  virtual void answer(const std::vector<Job>& jobs, const Answered& done) = 0;
};

class LocalAnswerer : public Answerer {
 public:
  LocalAnswerer(Model& model, const Tokenizer& tokenizer, const LongCtxOptions& options, int64_t length,
                LongCtxLength& cost)
      : model_(model), tokenizer_(tokenizer), options_(options), length_(length) {
    const SequenceState probe(model, 1);
    cost.state_bytes_per_sequence = probe.bytes_at(length);
    cost.sequences = std::clamp<int64_t>(options.memory_budget / std::max<int64_t>(cost.state_bytes_per_sequence, 1), 1,
                                         options.max_sequences);
    sequences_ = cost.sequences;
  }
  void answer(const std::vector<Job>& jobs, const Answered& done) override {
    EngineOptions engine;
    engine.max_sequences = sequences_;
    engine.context = length_;
    engine.prefill_chunk = options_.prefill_chunk;
    engine.precision = options_.precision;
    engine.prefix_cache_bytes = 0;  // samples share no prefix beyond the instruction
    Scheduler scheduler(model_, tokenizer_, engine);
    std::map<Scheduler::RequestId, std::pair<size_t, LongCtxSample>> in_flight;
    size_t next = 0, finished = 0;
    while (finished < jobs.size()) {
      while (next < jobs.size() && int64_t(in_flight.size()) < 2 * sequences_) {
        LongCtxSample sample = jobs[next].make();
        GenerationRequest r;
        r.prompt = sample.prompt;
        r.max_tokens = jobs[next].max_tokens;
        r.sampling.temperature = 0;
        in_flight.emplace(scheduler.add(std::move(r)), std::pair{next++, std::move(sample)});
      }
      for (Scheduler::Finished& f : scheduler.step()) {
        if (f.error) std::rethrow_exception(f.error);
        const auto it = in_flight.find(f.id);
        done(jobs[it->second.first], it->second.second, f.output.text, int64_t(f.output.tokens.size()));
        in_flight.erase(it);
        ++finished;
      }
    }
  }

 private:
  Model& model_;
  const Tokenizer& tokenizer_;
  const LongCtxOptions& options_;
  int64_t length_, sequences_ = 1;
};

class ServerAnswerer : public Answerer {
 public:
  explicit ServerAnswerer(const LongCtxOptions& options) : options_(options), client_(options.server) {
    HYLA_CHECK(client_.is_valid(), "--server {}: not a URL of the form http://host:port", options.server);
    client_.set_read_timeout(24 * 3600, 0);  // a million-token prefill takes minutes
    client_.set_write_timeout(600, 0);
    if (!options.api_key.empty()) client_.set_bearer_token_auth(options.api_key);
  }
  void answer(const std::vector<Job>& jobs, const Answered& done) override {
    for (const Job& job : jobs) {
      const LongCtxSample sample = job.make();
      const nlohmann::json body = {{"prompt", sample.prompt}, {"max_tokens", job.max_tokens}, {"temperature", 0}};
      const auto res = client_.Post("/v1/completions", body.dump(), "application/json");
      HYLA_CHECK(res, "--server {}: {}", options_.server, httplib::to_string(res.error()));
      nlohmann::json reply;
      try {
        reply = nlohmann::json::parse(res->body);
      } catch (const nlohmann::json::exception&) {
        fail("--server {}: /v1/completions answered {} with a body that is not JSON", options_.server, res->status);
      }
      HYLA_CHECK(res->status == 200, "--server {}: /v1/completions answered {}: {}", options_.server, res->status,
                 reply.contains("error") ? reply["error"].value("message", res->body) : res->body);
      const nlohmann::json& choice = reply.at("choices").at(0);
      done(job, sample, choice.at("text").get<std::string>(), reply.at("usage").value("completion_tokens", int64_t(0)));
    }
  }

 private:
  const LongCtxOptions& options_;
  httplib::Client client_;
};

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

void score(LongCtxCell& cell, const LongCtxSample& sample, const std::string& output) {
  const double found = share_found(output, sample.expected);
  ++cell.samples;
  cell.correct += found == 1.0;
  cell.found += found;
  cell.prompt_tokens += int64_t(sample.prompt.size());
  if (cell.examples.size() < 2) cell.examples.push_back({sample.expected, output, found == 1.0});
}

}  // namespace

int64_t default_longctx_samples(int64_t length) { return length <= 8192 ? 100 : length <= 131072 ? 25 : 5; }

LongCtxResult evaluate_longctx(Model* model, const Tokenizer& tokenizer, const std::string& haystack_text,
                               const std::string& haystack_source, const LongCtxOptions& options) {
  HYLA_CHECK(!options.tasks.empty(), "no long-context tasks given");
  HYLA_CHECK(!options.lengths.empty(), "no lengths given");
  HYLA_CHECK((model != nullptr) == options.server.empty(), "evaluate either a local model or a server, not both");
  for (const int64_t length : options.lengths) HYLA_CHECK(length >= 256, "length {} is below 256 tokens", length);
  for (const double depth : options.depths)
    HYLA_CHECK(depth >= 0 && depth <= 1, "depth {} is outside [0, 1]", depth);
  HYLA_CHECK(!options.depths.empty(), "no depths given");
  const auto start = std::chrono::steady_clock::now();
  const Haystack haystack(haystack_text, tokenizer);
  std::vector<LongCtxTask> tasks;
  for (const std::string& name : options.tasks) tasks.push_back(longctx_task(name));

  LongCtxResult result;
  result.seed = options.seed;
  result.wording = options.wording;
  result.model = options.server;
  result.haystack = haystack_source;
  result.contamination_checked = !options.train_text.empty();
  // Cells in the order reported: task, length, depth.
  auto samples_of = [&](int64_t length) { return options.samples > 0 ? options.samples : default_longctx_samples(length); };
  for (size_t t = 0; t < tasks.size(); ++t)
    for (const int64_t length : options.lengths) {
      const std::vector<double> depths = tasks[t].uses_depth ? options.depths : std::vector<double>{-1.0};
      // Whether a sample fits depends on its drawn keys and values, so every sample of the task at
      // this length is sized (without its context: the size check comes first and costs little).
      try {
        for (const double depth : depths)
          for (int64_t i = 0; i < samples_of(length); ++i)
            make_longctx_sample(tasks[t], haystack, tokenizer, length, depth, options.seed, uint64_t(i),
                                /*no_context=*/true, options.wording);
      } catch (const LongCtxDoesNotFit& e) {
        result.skipped.push_back({tasks[t].name, length, e.what()});
        continue;
      }
      for (const double depth : depths) {
        LongCtxCell cell;
        cell.task = tasks[t].name;
        cell.task_index = t;
        cell.tier = tasks[t].tier;
        cell.length = length;
        cell.depth = depth;
        result.cells.push_back(std::move(cell));
      }
    }
  HYLA_CHECK(!result.cells.empty(), "no task fits any of the lengths: {}", result.skipped.front().reason);
  uint64_t total = 0;
  for (const LongCtxCell& cell : result.cells) total += uint64_t(samples_of(cell.length));
  // The no-context control runs a task at the shortest length it fits (0: it fits none).
  std::vector<int64_t> control_length(tasks.size(), 0);
  for (const LongCtxCell& cell : result.cells) {
    int64_t& shortest = control_length[cell.task_index];
    shortest = shortest == 0 ? cell.length : std::min(shortest, cell.length);
  }
  if (options.no_context_control)
    for (const int64_t length : control_length) total += length > 0 ? uint64_t(samples_of(length)) : 0;
  std::optional<Progress> progress;
  if (options.progress) progress.emplace("eval longctx", total, "samples");

  auto check_contamination = [&](const LongCtxSample& sample) {
    if (!result.contamination_checked) return;
    ++result.contamination_samples;
    for (const std::string& sentence : sample.inserted) {
      if (options.train_text.find(sentence) == std::string::npos) continue;
      ++result.contamination_found;
      if (result.contamination_examples.size() < 5) result.contamination_examples.push_back(sentence);
      break;
    }
  };
  // The no-context control plants nothing, so only the lengths' samples go through the contamination check.
  auto run = [&](std::vector<LongCtxCell>& cells, const std::vector<Job>& jobs, int64_t context, bool planted,
                 LongCtxLength& cost) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Answerer> answerer;
    if (options.server.empty()) answerer = std::make_unique<LocalAnswerer>(*model, tokenizer, options, context, cost);
    else answerer = std::make_unique<ServerAnswerer>(options);
    answerer->answer(jobs, [&](const Job& job, const LongCtxSample& sample, const std::string& output, int64_t generated) {
      score(cells[job.cell], sample, output);
      if (planted) check_contamination(sample);
      ++cost.samples;
      cost.prompt_tokens += int64_t(sample.prompt.size());
      cost.generated_tokens += generated;
      if (progress) progress->advance(1);
    });
    cost.seconds = seconds_since(t0);
    cost.peak_rss_bytes = peak_rss_bytes();
  };

  for (const int64_t length : options.lengths) {
    std::vector<Job> jobs;
    for (size_t c = 0; c < result.cells.size(); ++c) {
      const LongCtxCell& cell = result.cells[c];
      if (cell.length != length) continue;
      const LongCtxTask& task = tasks[cell.task_index];
      for (int64_t i = 0; i < samples_of(length); ++i)
        jobs.push_back({c,
                        [&haystack, &tokenizer, &options, &task, length, depth = cell.depth, i] {
                          return make_longctx_sample(task, haystack, tokenizer, length, depth, options.seed, uint64_t(i),
                                                     /*no_context=*/false, options.wording);
                        },
                        task.max_tokens});
    }
    if (jobs.empty()) continue;  // every task skipped at this length
    LongCtxLength cost;
    cost.length = length;
    run(result.cells, jobs, length, /*planted=*/true, cost);
    result.lengths.push_back(cost);
  }

  if (options.no_context_control) {
    std::vector<Job> jobs;
    int64_t longest = 0;
    for (size_t t = 0; t < tasks.size(); ++t) {
      const int64_t length = control_length[t];
      if (length == 0) continue;
      LongCtxCell cell;
      cell.task = tasks[t].name;
      cell.task_index = t;
      cell.tier = tasks[t].tier;
      const size_t control = result.no_context.size();
      result.no_context.push_back(std::move(cell));
      for (int64_t i = 0; i < samples_of(length); ++i) {
        const double depth = options.depths[size_t(i) % options.depths.size()];
        auto make = [&haystack, &tokenizer, &options, &task = tasks[t], length, depth, i] {
          return make_longctx_sample(task, haystack, tokenizer, length, depth, options.seed, uint64_t(i),
                                     /*no_context=*/true, options.wording);
        };
        longest = std::max<int64_t>(longest, int64_t(make().prompt.size()) + tasks[t].max_tokens);
        jobs.push_back({control, make, tasks[t].max_tokens});
      }
    }
    LongCtxLength cost;
    run(result.no_context, jobs, longest, /*planted=*/false, cost);
  }
  if (progress) progress->finish();
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace hyla
