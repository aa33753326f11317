#pragma once
// The inference engine: one worker thread owns the model and runs continuous batching. Each
// iteration forwards, in one model call, at most one prefill chunk of an admitted request plus one
// decode token for every running sequence (chunked prefill: a long prompt never stalls the others),
// samples, streams, and retires finished or cancelled sequences. Prompt prefixes are restored from
// the prefix cache when an earlier request shared them.
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "hyla/data/tokenizer.h"
#include "hyla/infer/prefix_cache.h"
#include "hyla/infer/sampler.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/model/model.h"

namespace hyla {

struct EngineOptions {
  int64_t max_sequences = 16;       // decoded together (slots)
  int64_t context = 8192;           // tokens per sequence: prompt + generation
  int64_t prefill_chunk = 512;      // prompt tokens per iteration
  Precision precision = Precision::BF16;
  DType latent_dtype = DType::BF16;
  int64_t prefix_cache_bytes = int64_t(256) << 20;  // 0 disables prompt-state reuse
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stop_at_end_tokens = true;
  bool logprobs = false;       // log-probability of each generated token
  bool prompt_logprobs = false; // and of each prompt token after the first (for scoring, echo)
  int top_logprobs = 0;         // with either: also the most likely tokens at each position
  // Called on the engine thread with each new piece of text (complete UTF-8, stop strings held
  // back); returning false cancels the request (e.g. the client disconnected).
  std::function<bool(std::string_view text)> on_text;
  // Polled on the engine thread before each step while the request waits or runs; returning true
  // cancels it (e.g. a non-streaming client hung up).
  std::function<bool()> is_cancelled;
};

// Why a request ended: an end token or stop string, max_tokens or the context, or its client left.
enum class FinishReason : uint8_t { Stop, Length, Cancelled };
inline constexpr FinishReason kFinishReasons[] = {FinishReason::Stop, FinishReason::Length, FinishReason::Cancelled};
const char* to_string(FinishReason reason);  // "stop", "length", "cancelled"

struct GenerationOutput {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish_reason = FinishReason::Stop;
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0;
  std::vector<double> token_logprobs;   // per generated token (with logprobs)
  std::vector<double> prompt_logprobs;  // per prompt token, NaN for the first (with prompt_logprobs)
  std::vector<std::vector<TokenLogprob>> top_logprobs, prompt_top_logprobs;  // with top_logprobs
  double time_to_first_token = 0, seconds = 0;
};

// A latency histogram in Prometheus' form: cumulative counts per upper bound (seconds), the last
// for +Inf, and the sum and number of the observations.
struct LatencyHistogram {
  std::vector<double> bounds;
  std::vector<int64_t> cumulative;
  double sum = 0;
  int64_t total = 0;
  LatencyHistogram() : cumulative(1, 0) {}
  explicit LatencyHistogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), cumulative(bounds.size() + 1, 0) {}
  void observe(double seconds);
};

// Counters and histograms for /metrics.
struct EngineStats {
  int64_t requests = 0, prompt_tokens = 0, generated_tokens = 0, cached_prompt_tokens = 0, running = 0, waiting = 0;
  LatencyHistogram ttft, itl;  // time to first token, inter-token latency
  std::array<int64_t, std::size(kFinishReasons)> finished{};  // requests by FinishReason
};

class Engine {
 public:
  // The engine uses the model and tokenizer (which must outlive it) from its worker thread only.
  Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; the future is fulfilled when it finishes (errors arrive as exceptions).
  std::future<GenerationOutput> submit(GenerationRequest request);
  EngineStats stats() const;
  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const EngineOptions& options() const { return options_; }
  // The state memory: one slot's arithmetic at full context, and all slots together.
  std::string memory_summary() const;

 private:
  struct Active;
  void run();
  void admit_waiting();
  void drop_cancelled();
  void step();
  void finish(Active& a, FinishReason reason);
  void record(LatencyHistogram EngineStats::*histogram, double seconds);

  Model* model_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  std::vector<std::unique_ptr<SequenceState>> slots_;
  std::vector<bool> slot_used_;
  PrefixCache prefix_cache_;
  std::vector<int32_t> end_ids_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Active>> waiting_;
  std::vector<std::unique_ptr<Active>> running_;
  EngineStats stats_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace hyla
