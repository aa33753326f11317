#pragma once
// Continuous batching, synchronous: requests are added, and each step() admits waiting requests
// into free slots (restoring cached prompt prefixes), runs one model call with prefill chunks of
// the oldest admitted requests (at most prefill_chunk prompt tokens together) plus one decode token
// for every running sequence (chunked prefill: a long prompt never stalls the others), samples, streams text, and retires finished or cancelled
// requests. An RL rollout loop, an evaluator or the trainer's samples drive it directly, on their
// own thread; Engine (engine.h) runs it on a worker thread for `serve`, `generate` and `chat`.
//
// What crosses this seam: requests in, finished outputs out (under the id add() gave), counters.
// Never the model's buffers, the slots' memory or a thread: it runs on the caller's.
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hyla/data/tokenizer.h"
#include "hyla/infer/grammar.h"
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
  // Prompt-state snapshots every this many prompt tokens (prefill chunks end there), before every
  // prompt's last token and at the end of every request: a later prompt sharing a prefix re-reads
  // at most this many of its tokens, and one equal to an earlier prompt only its last.
  int64_t snapshot_interval = 512;
  // Bytes the slots at full context and the prompt-state cache may take together; the constructor
  // refuses options over it, saying what fits (0: unchecked). Slot memory is touched as tokens
  // arrive, so a long context costs resident memory only when a prompt uses it.
  int64_t memory_budget = 0;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  // The images whose patches fill the prompt's <|image_pad|> rows, in order, each as the model
  // reads it (data/image_file.h's to_model_image): image i takes the next (H/P)·(W/P) pad rows,
  // which must be consecutive. The prefix cache keys on their content, so prompts that differ only
  // in an image never share a cached state, and a prefill chunk never ends inside an image.
  std::vector<Image> images;
  int64_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stop_at_end_tokens = true;
  // Only text of this grammar's language is generated (grammar.h), and generation stops when the
  // grammar allows nothing more; end tokens come only where it may end. Shared by choices. With
  // grammar_after, generation is free until the model writes that token, then follows the grammar
  // (a tool call the model chose to make).
  std::shared_ptr<const Grammar> grammar;
  std::optional<int32_t> grammar_after;
  bool logprobs = false;       // log-probability of each generated token
  bool prompt_logprobs = false; // and of each prompt token after the first (for scoring, echo)
  int top_logprobs = 0;         // with either: also the most likely tokens at each position
  // Called from step() with each new piece of text (complete UTF-8, stop strings held back);
  // returning false cancels the request (e.g. the client disconnected).
  std::function<bool(std::string_view text)> on_text;
  // Polled at the start of each step while the request waits or runs; returning true cancels it
  // (e.g. a non-streaming client hung up).
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
  std::string stop_sequence;  // the request's stop string that ended it, if one did
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
  int64_t prompt_state_bytes = 0, prompt_state_snapshots = 0;  // the prompt-state cache now
  // Prompts that restored a prefix (from the prompt-state cache, or a free slot's own state), or none.
  int64_t prompt_state_hits = 0, prompt_state_misses = 0;
  LatencyHistogram ttft, itl;  // time to first token, inter-token latency
  std::array<int64_t, std::size(kFinishReasons)> finished{};  // requests by FinishReason
};

class Scheduler {
 public:
  using RequestId = uint64_t;
  struct Finished {
    RequestId id;
    GenerationOutput output;
    std::exception_ptr error;  // this request alone failed (its grammar could not go on); output is partial
  };

  // The model and tokenizer must outlive the scheduler.
  Scheduler(Model& model, const Tokenizer& tokenizer, const EngineOptions& options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Throws hyla::Error for a request that can never run (empty prompt, ids outside the
  // vocabulary, more tokens than the context).
  void validate(const GenerationRequest& request) const;
  RequestId add(GenerationRequest request);  // validates, then queues
  // One iteration; returns the requests that finished in it. An exception from the model
  // propagates with every request still queued or running (abort() ends them).
  std::vector<Finished> step();
  // Ends every request, for a model failure or shutdown; returns their ids.
  std::vector<RequestId> abort();
  bool idle() const { return waiting_.empty() && running_.empty(); }
  // After the model's weights change (an RL update): cached prompt states are stale, and dropped.
  void weights_changed();

  // Slots (llama-server's /slots). A free slot keeps the state its last request left (the prompt
  // and the reply but for its last token), and a request whose prompt extends a free slot's tokens
  // takes that slot and reads only what follows: the same prompt-state reuse as the prefix cache's,
  // on with it (EngineOptions::prefix_cache_bytes > 0) or for a slot restored from a file. Slot
  // files: slot_file.h. Each action throws hyla::Error naming the problem (no such slot, a slot
  // a request is running in, a file that does not fit), leaving the slot as it was.
  struct SlotInfo {
    int id = 0;
    bool processing = false;
    int64_t tokens = 0;  // in the slot's state
    RequestId request = 0;  // the request running in it, or its last (0: none yet)
    int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0, max_tokens = 0;  // that request's
  };
  struct SlotTransfer {
    int64_t tokens = 0, bytes = 0;
    double seconds = 0;
  };
  std::vector<SlotInfo> slots() const;
  bool slot_busy(int slot) const;  // a request runs in it (false for a slot that does not exist)
  SlotTransfer save_slot(int slot, const std::filesystem::path& file);
  SlotTransfer restore_slot(int slot, const std::filesystem::path& file);
  int64_t erase_slot(int slot);  // empties the slot's state; returns the tokens it held

  const EngineStats& stats() const { return stats_; }  // gauges as of the last step
  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const EngineOptions& options() const { return options_; }
  // The state memory: one slot's arithmetic at full context, and all slots together.
  std::string memory_summary() const;

 private:
  struct Active;
  struct StepBatch;
  void admit_waiting(std::vector<Finished>& finished);
  // The free slot for `a` and the prompt tokens its state already holds: the one whose tokens `a`'s
  // prompt extends furthest, if reuse applies and no cached prefix is longer; else the free slot
  // holding nothing, or the least recently used (0 tokens: to be reset).
  std::pair<int, int64_t> choose_slot(const Active& a);
  int checked_slot(int slot) const;  // `slot`, or an error naming the slots there are
  void drop_cancelled(std::vector<Finished>& finished);
  void forward_and_sample(std::vector<Finished>& finished);
  void plan_prefill_chunks(StepBatch& batch) const;
  int64_t prefill_chunk_end(const Active& a) const;
  void plan_decode_tokens(StepBatch& batch) const;
  void run_forward(StepBatch& batch);
  bool advance_sequence(const StepBatch& batch, size_t i);
  void score_prompt_rows(Active& a, const float* rows, int64_t count) const;
  bool read_prompt_chunk(Active& a, int64_t count);
  const uint8_t* grammar_mask(Active& a);
  void record_token(Active& a, int32_t token, const float* row, bool first_token,
                    std::chrono::steady_clock::time_point now);
  std::optional<FinishReason> stream_token(Active& a, int32_t token);
  void finish(Active& a, FinishReason reason, std::vector<Finished>& finished);
  // validate()'s checks; returns where each image's pad rows start in the prompt, with its
  // content digest (errors name the rule broken).
  std::vector<PromptInput> checked_image_rows(const GenerationRequest& request) const;

  Model* model_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  std::vector<std::unique_ptr<SequenceState>> slots_;
  std::vector<bool> slot_used_;
  // What each slot's state holds once its request finished (prompt and reply tokens, images), for
  // reuse and slot files; empty while a request runs in it or after a failure.
  struct SlotHistory {
    std::vector<int32_t> tokens;
    std::vector<PromptInput> inputs;
    bool restored = false;  // from a slot file: reused even with the prefix cache off
    uint64_t last_use = 0;
    RequestId last_request = 0;
    int64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0, max_tokens = 0;
  };
  std::vector<SlotHistory> history_;
  uint64_t slot_clock_ = 0;
  int64_t slot_reuses_ = 0;  // prompts that continued a free slot's own state
  PrefixCache prefix_cache_;
  std::vector<int32_t> end_ids_;
  int64_t sample_vocab_ = 0;  // ids past the tokenizer's vocabulary (a model's may be padded) are never sampled
  // The tokenizer's <|image_pad|>, -1 without one. Its rows are a request's image patches, so a
  // model never generates it (a generated one would make the conversation's next prompt invalid).
  int32_t image_pad_id_ = -1;
  std::unique_ptr<GrammarVocabulary> grammar_vocabulary_;  // built for the first constrained request
  std::deque<std::unique_ptr<Active>> waiting_;
  std::vector<std::unique_ptr<Active>> running_;
  EngineStats stats_;
  RequestId next_id_ = 1;
};

}  // namespace hyla
