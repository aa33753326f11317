#include "hyla/infer/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "hyla/core/error.h"
#include "hyla/data/chat_template.h"
#include "hyla/infer/slot_file.h"
#include "hyla/infer/text_stream.h"

namespace hyla {

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

using Clock = std::chrono::steady_clock;

namespace {
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
const std::vector<double> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}  // namespace

struct Scheduler::Active {
  RequestId id;
  GenerationRequest request;
  GenerationOutput output;
  Sampler sampler;
  std::optional<GrammarMatcher> grammar;
  std::vector<uint8_t> allowed;  // the grammar's mask, per token
  std::exception_ptr error;      // why this request alone stopped
  TextStream text;
  int slot = -1;
  int64_t prefilled = 0;   // prompt tokens in the state
  PrefixCache::Cursor snapshots;  // where this request's prompt-state snapshots reached
  std::vector<PromptInput> images;  // each image's first pad row and content digest (the prefix cache's key)
  std::vector<int64_t> image_ends;  // the row after each image's last pad
  int32_t next = -1;       // the last sampled token, to be fed in the next step
  Clock::time_point start, last;
  Active(RequestId id, GenerationRequest r)
      : id(id), request(std::move(r)), sampler(request.sampling), text(request.stop) {
    if (request.grammar && !request.grammar_after) grammar.emplace(*request.grammar);
  }
};

namespace {

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", double(bytes) / double(int64_t(1) << 30)); }

void check_memory_budget(const Model& model, const EngineOptions& o) {
  if (o.memory_budget <= 0) return;
  const SequenceState probe(model, 1, o.latent_dtype);  // the per-token arithmetic, nothing at full size
  const int64_t slot = probe.bytes_at(o.context), cache = std::max<int64_t>(o.prefix_cache_bytes, 0);
  const int64_t need = slot * o.max_sequences + cache;
  if (need <= o.memory_budget) return;
  const int64_t room = o.memory_budget - cache;
  const int64_t slots_fit = room > 0 ? room / slot : 0;
  const int64_t per_slot = room > 0 ? room / o.max_sequences : 0;
  const int64_t context_fits = per_slot > probe.fixed_bytes() && probe.bytes_per_token() > 0
                                   ? (per_slot - probe.fixed_bytes()) / probe.bytes_per_token()
                                   : 0;
  throw Error(fmt::format(
      "engine: {} sequences of {} tokens take {} of state ({} each: {}) + {} of prompt-state cache = {}, over the memory "
      "budget of {}: {} sequences fit at this context, or {} sequences fit at a context of {} tokens",
      o.max_sequences, o.context, gib(slot * o.max_sequences), gib(slot), probe.describe_memory(o.context), gib(cache),
      gib(need), gib(o.memory_budget), slots_fit, o.max_sequences, context_fits));
}

}  // namespace

Scheduler::Scheduler(Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : model_(&model),
      tokenizer_(tokenizer),
      options_(options),
      prefix_cache_(options.prefix_cache_bytes, options.snapshot_interval) {
  HYLA_CHECK(options.max_sequences > 0 && options.context > 1 && options.prefill_chunk > 0 &&
                 options.snapshot_interval > 0,
             "engine: max_sequences, context, prefill_chunk and snapshot_interval must be positive");
  const int64_t window = model.config().max_position_embeddings;
  HYLA_CHECK(options.context <= window, "engine: a context of {} tokens exceeds the model's window ({} tokens, "
             "max_position_embeddings)", options.context, window);
  check_memory_budget(model, options);
  for (int64_t i = 0; i < options.max_sequences; ++i)
    slots_.push_back(std::make_unique<SequenceState>(model, options.context, options.latent_dtype));
  slot_used_.assign(slots_.size(), false);
  history_.resize(slots_.size());
  end_ids_ = ChatTemplate(tokenizer).end_ids();
  sample_vocab_ = std::min<int64_t>(model.config().vocab_size, tokenizer.vocab_size());
  // hyla's image positions, or Kimi K3's (its chat format's media spans).
  if (auto id = tokenizer.token_id("<|image_pad|>")) image_pad_id_ = *id;
  else if (auto media = tokenizer.token_id("<|media_pad|>")) image_pad_id_ = *media;
  stats_.ttft = stats_.itl = LatencyHistogram(kBuckets);
}

Scheduler::~Scheduler() = default;

std::string Scheduler::memory_summary() const {
  const SequenceState& slot = *slots_.front();
  const ExpertOffload* offload = model_->expert_offload();
  return fmt::format("state memory per sequence: {}; {} slot{}: {:.2f} MiB{}", slot.describe_memory(options_.context),
                     slots_.size(), slots_.size() == 1 ? "" : "s",
                     double(slot.bytes_at(options_.context)) * double(slots_.size()) / double(1 << 20),
                     offload ? fmt::format("\n{}", offload->describe_memory()) : std::string());
}

void Scheduler::validate(const GenerationRequest& request) const { checked_image_rows(request); }

std::vector<PromptInput> Scheduler::checked_image_rows(const GenerationRequest& request) const {
  HYLA_CHECK(!request.prompt.empty(), "the prompt is empty");
  HYLA_CHECK(request.max_tokens >= 0, "max_tokens must be >= 0, got {}", request.max_tokens);
  check_sampling(request.sampling);
  HYLA_CHECK(!request.grammar_after || request.grammar, "grammar_after needs a grammar");
  for (const auto& [token, bias] : request.sampling.logit_bias)
    HYLA_CHECK(token < tokenizer_.vocab_size(), "logit_bias names token {}, outside the vocabulary (size {})", token,
               tokenizer_.vocab_size());
  for (int32_t id : request.prompt)
    HYLA_CHECK(id >= 0 && id < model_->config().vocab_size, "prompt token {} is outside the vocabulary (size {})", id,
               model_->config().vocab_size);
  const int64_t need = int64_t(request.prompt.size()) + std::max<int64_t>(request.max_tokens, 1);
  HYLA_CHECK(need <= options_.context, "prompt ({} tokens) + max_tokens ({}) exceed the context of {} tokens",
             request.prompt.size(), request.max_tokens, options_.context);
  int64_t pads = 0;
  if (image_pad_id_ >= 0)
    for (int32_t id : request.prompt) pads += id == image_pad_id_;
  if (request.images.empty()) {
    HYLA_CHECK(pads == 0, "the prompt has {} <|image_pad|> tokens but no images", pads);
    return {};
  }
  const VisionConfig& v = model_->config().vision;
  HYLA_CHECK(v.enabled, "the request has images but this model reads none (vision.enabled is false)");
  const int64_t P = v.position_pixels();
  std::vector<PromptInput> rows;
  int64_t row = 0;
  for (size_t i = 0; i < request.images.size(); ++i) {
    const Image& img = request.images[i];
    HYLA_CHECK(img.channels == v.channels, "image {}: {} channels, the model reads {}", i + 1, img.channels, v.channels);
    HYLA_CHECK(img.height > 0 && img.width > 0 && img.height % P == 0 && img.width % P == 0,
               "image {}: {}x{} pixels is not a whole number of {}x{} patches", i + 1, img.width, img.height, P, P);
    HYLA_CHECK(v.tower != VisionTower::Patches || (img.height / P <= v.max_grid && img.width / P <= v.max_grid),
               "image {}: {}x{} patches exceed vision.max_grid {}", i + 1, img.width / P, img.height / P, v.max_grid);
    HYLA_CHECK(int64_t(img.pixels.size()) == img.height * img.width * img.channels, "image {}: {} bytes for {}x{}x{}",
               i + 1, img.pixels.size(), img.height, img.width, img.channels);
    while (row < int64_t(request.prompt.size()) && request.prompt[size_t(row)] != image_pad_id_) ++row;
    const int64_t patches = (img.height / P) * (img.width / P);
    HYLA_CHECK(row + patches <= int64_t(request.prompt.size()) &&
                   std::all_of(request.prompt.begin() + row, request.prompt.begin() + row + patches,
                               [&](int32_t id) { return id == image_pad_id_; }),
               "image {} needs {} consecutive <|image_pad|> tokens in the prompt at its place", i + 1, patches);
    const uint64_t shape[3] = {uint64_t(img.height), uint64_t(img.width), uint64_t(img.channels)};
    const uint64_t digest = content_digest(img.pixels, content_digest({reinterpret_cast<const uint8_t*>(shape), sizeof shape}));
    rows.push_back({row, digest});
    row += patches;
  }
  int64_t used = 0;
  for (const Image& img : request.images) used += (img.height / P) * (img.width / P);
  HYLA_CHECK(used == pads, "the prompt has {} <|image_pad|> tokens but its {} images fill {}", pads,
             request.images.size(), used);
  return rows;
}

Scheduler::RequestId Scheduler::add(GenerationRequest request) {
  std::vector<PromptInput> images = checked_image_rows(request);
  auto active = std::make_unique<Active>(next_id_++, std::move(request));
  const int64_t P = model_->config().vision.position_pixels();
  for (size_t i = 0; i < images.size(); ++i) {
    const Image& img = active->request.images[i];
    active->image_ends.push_back(images[i].row + (img.height / P) * (img.width / P));
  }
  active->images = std::move(images);
  active->start = Clock::now();
  ++stats_.requests;
  waiting_.push_back(std::move(active));
  stats_.waiting = int64_t(waiting_.size());
  return waiting_.back()->id;
}

std::vector<Scheduler::Finished> Scheduler::step() {
  std::vector<Finished> finished;
  drop_cancelled(finished);
  admit_waiting(finished);
  forward_and_sample(finished);
  stats_.running = int64_t(running_.size());
  stats_.waiting = int64_t(waiting_.size());
  stats_.prompt_state_bytes = prefix_cache_.bytes();
  stats_.prompt_state_snapshots = prefix_cache_.snapshots();
  stats_.prompt_state_hits = prefix_cache_.hits() + slot_reuses_;
  stats_.prompt_state_misses = prefix_cache_.misses();
  return finished;
}

std::vector<Scheduler::RequestId> Scheduler::abort() {
  std::vector<RequestId> ids;
  for (auto& a : running_) {
    ids.push_back(a->id);
    slot_used_[size_t(a->slot)] = false;
    history_[size_t(a->slot)].tokens.clear();  // stopped mid-step: the state is not known to be whole
  }
  for (auto& a : waiting_) ids.push_back(a->id);
  running_.clear();
  waiting_.clear();
  stats_.running = stats_.waiting = 0;
  return ids;
}

void Scheduler::weights_changed() {
  prefix_cache_.clear();
  for (SlotHistory& h : history_) h = {};
  stats_.prompt_state_bytes = stats_.prompt_state_snapshots = 0;
}

void LatencyHistogram::observe(double seconds) {
  for (size_t i = 0; i < cumulative.size(); ++i)
    if (i == bounds.size() || seconds <= bounds[i]) ++cumulative[i];
  sum += seconds;
  ++total;
}

// Finishes every waiting or running request whose client has gone.
void Scheduler::drop_cancelled(std::vector<Finished>& finished) {
  std::vector<std::unique_ptr<Active>> gone_waiting;
  std::vector<Active*> gone_running;
  for (auto it = waiting_.begin(); it != waiting_.end();)
    if ((*it)->request.is_cancelled && (*it)->request.is_cancelled()) {
      gone_waiting.push_back(std::move(*it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  for (auto& a : running_)
    if (a->request.is_cancelled && a->request.is_cancelled()) gone_running.push_back(a.get());
  for (auto& a : gone_waiting) finish(*a, FinishReason::Cancelled, finished);
  for (Active* a : gone_running) finish(*a, FinishReason::Cancelled, finished);
}

// Moves waiting requests into free slots, restoring cached prompt prefixes.
void Scheduler::admit_waiting(std::vector<Finished>& finished) {
  for (;;) {
    if (waiting_.empty()) return;
    const auto [slot, held] = choose_slot(*waiting_.front());
    if (slot < 0) return;
    std::unique_ptr<Active> a = std::move(waiting_.front());
    waiting_.pop_front();
    slot_used_[size_t(slot)] = true;
    a->slot = slot;
    SequenceState& state = *slots_[size_t(slot)];
    history_[size_t(slot)].tokens.clear();
    a->output.prompt_tokens = int64_t(a->request.prompt.size());
    if (a->request.prompt_logprobs) {  // the first token has no distribution; the prefill scores the rest
      a->output.prompt_logprobs.push_back(NAN);
      if (a->request.top_logprobs > 0) a->output.prompt_top_logprobs.emplace_back();
    }
    if (held > 0) {
      a->prefilled = held;  // the slot's state goes on from where its last request left it
      ++slot_reuses_;
    } else {
      state.reset();
      // Scoring needs every prompt row's logits, so a scored prompt is read whole, never restored.
      a->prefilled =
          a->request.prompt_logprobs ? 0 : prefix_cache_.restore(a->request.prompt, a->images, state, a->snapshots);
    }
    a->output.cached_prompt_tokens = a->prefilled;
    stats_.prompt_tokens += a->output.prompt_tokens;
    stats_.cached_prompt_tokens += a->prefilled;
    if (a->request.max_tokens == 0 && !a->request.prompt_logprobs) {  // nothing to read or generate
      finish(*a, FinishReason::Length, finished);
      continue;
    }
    running_.push_back(std::move(a));
  }
}

std::pair<int, int64_t> Scheduler::choose_slot(const Active& a) {
  const std::vector<int32_t>& prompt = a.request.prompt;
  int best = -1, empty = -1, oldest = -1;
  int64_t best_length = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slot_used_[i]) continue;
    const SlotHistory& h = history_[i];
    if (h.tokens.empty()) {
      if (empty < 0) empty = int(i);
      continue;
    }
    if (oldest < 0 || h.last_use < history_[size_t(oldest)].last_use) oldest = int(i);
    const int64_t n = int64_t(h.tokens.size());
    // The prompt's last token must still be read for its logits; a scored prompt is read whole.
    if (n >= int64_t(prompt.size()) || n <= best_length || a.request.prompt_logprobs) continue;
    if (!prefix_cache_.enabled() && !h.restored) continue;
    if (!std::equal(h.tokens.begin(), h.tokens.end(), prompt.begin())) continue;
    const auto images_before = std::ranges::count_if(a.images, [&](const PromptInput& in) { return in.row < n; });
    if (!std::ranges::equal(h.inputs, std::span(a.images).first(size_t(images_before)))) continue;
    best = int(i);
    best_length = n;
  }
  if (best >= 0 && best_length >= prefix_cache_.cached_length(prompt, a.images)) return {best, best_length};
  return {empty >= 0 ? empty : oldest, 0};
}

// One step's model call: the sequences in it, in order, and what the model gave back for them.
struct Scheduler::StepBatch {
  std::vector<Active*> sequences;
  std::vector<int64_t> lengths;       // rows per sequence: a prefill chunk, or the one token to feed
  ModelInput in;
  std::vector<int64_t> first_output;  // per sequence, its first row of logits
  Tensor logits;
  Clock::time_point returned;         // when the logits came: the time of the tokens sampled from them
};

// One model call: prefill chunks of the oldest requests still reading their prompts (within the
// step's prefill budget), plus one token for every sequence that is generating.
void Scheduler::forward_and_sample(std::vector<Finished>& finished) {
  StepBatch batch;
  plan_prefill_chunks(batch);
  plan_decode_tokens(batch);
  if (batch.sequences.empty()) return;
  run_forward(batch);
  std::vector<Active*> done;
  for (size_t i = 0; i < batch.sequences.size(); ++i)
    if (advance_sequence(batch, i)) done.push_back(batch.sequences[i]);
  for (Active* a : done) finish(*a, a->output.finish_reason, finished);
}

// Prefill chunks of the oldest requests still reading their prompts, while they fit the step's
// budget of prefill_chunk tokens (the oldest always goes): many short prompts (the turns of
// agent rollouts) are read together.
void Scheduler::plan_prefill_chunks(StepBatch& batch) const {
  int64_t budget = options_.prefill_chunk;
  for (auto& a : running_)
    if (a->prefilled < int64_t(a->request.prompt.size())) {
      const int64_t end = prefill_chunk_end(*a);
      if (!batch.sequences.empty() && end - a->prefilled > budget) break;
      budget -= end - a->prefilled;
      for (size_t k = 0; k < a->images.size(); ++k) {
        const int64_t first = a->images[k].row;
        if (first >= a->prefilled && first < end) batch.in.images.push_back(a->request.images[k]);
      }
      if (!batch.in.images.empty()) batch.in.image_pad_id = image_pad_id_;
      batch.sequences.push_back(a.get());
      batch.lengths.push_back(end - a->prefilled);
      batch.in.ids.insert(batch.in.ids.end(), a->request.prompt.begin() + a->prefilled,
                          a->request.prompt.begin() + end);
      if (budget <= 0) break;
    }
}

// Each request's chunks end where they would alone, so batching never changes what a sequence
// computes.
int64_t Scheduler::prefill_chunk_end(const Active& a) const {
  int64_t end = std::min<int64_t>(a.prefilled + options_.prefill_chunk, int64_t(a.request.prompt.size()));
  if (prefix_cache_.enabled()) {  // a chunk ends at the next snapshot point, if it comes first
    const int64_t interval = prefix_cache_.interval();
    end = std::min(end, (a.prefilled / interval + 1) * interval);
    const int64_t all_but_last = int64_t(a.request.prompt.size()) - 1;
    if (a.prefilled < all_but_last) end = std::min(end, all_but_last);
  }
  // A chunk never ends inside an image: it stops before one that does not fit, or takes whole one that starts it.
  for (size_t k = 0; k < a.images.size(); ++k) {
    const int64_t first = a.images[k].row, last = a.image_ends[k];
    if (first < end && last > end) end = first > a.prefilled ? first : last;
  }
  return end;
}

void Scheduler::plan_decode_tokens(StepBatch& batch) const {
  for (auto& a : running_)
    if (a->next >= 0) {
      batch.sequences.push_back(a.get());
      batch.lengths.push_back(1);
      batch.in.ids.push_back(a->next);
    }
}

void Scheduler::run_forward(StepBatch& batch) {
  std::vector<int64_t> offsets;
  std::vector<SequenceCache> caches;
  for (Active* a : batch.sequences) {
    offsets.push_back(slots_[size_t(a->slot)]->length());
    caches.push_back(slots_[size_t(a->slot)]->cache());
  }
  batch.in.tokens = TokenBatch::packed(batch.lengths, offsets);
  // Logits come out for each sequence's last row, and for every row of a prefill chunk that is scored.
  ForwardOptions forward{.precision = options_.precision, .outputs = Outputs::Rows};
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    batch.first_output.push_back(int64_t(forward.rows.size()));
    const int64_t end = batch.in.tokens.starts[i + 1];
    const bool scored = batch.sequences[i]->next < 0 && batch.sequences[i]->request.prompt_logprobs;
    for (int64_t r = scored ? batch.in.tokens.starts[i] : end - 1; r < end; ++r) forward.rows.push_back(r);
  }
  batch.logits = model_->forward(batch.in, forward, caches).logits;
  for (size_t i = 0; i < batch.sequences.size(); ++i) slots_[size_t(batch.sequences[i]->slot)]->cache() = caches[i];
  batch.returned = Clock::now();
}

// Sequence i's share of the step's logits: scores its prompt rows, moves its prefill on, or
// samples, records and streams its next token. Returns whether it is done (its finish_reason or
// error set).
bool Scheduler::advance_sequence(const StepBatch& batch, size_t i) {
  Active& a = *batch.sequences[i];
  const int64_t V = model_->config().vocab_size, rows = batch.lengths[i];
  const float* first = batch.logits.data<float>() + batch.first_output[i] * V;
  const bool prefilling = a.next < 0, scored = prefilling && a.request.prompt_logprobs;
  if (scored) score_prompt_rows(a, first, rows);
  if (prefilling && !read_prompt_chunk(a, rows)) return false;  // more prompt to read
  if (a.request.max_tokens == 0) {  // scoring only: the prompt is read, nothing is generated
    a.output.finish_reason = FinishReason::Length;
    return true;
  }
  const uint8_t* allowed = nullptr;
  if (a.grammar && !(allowed = grammar_mask(a))) return true;
  const float* row = first + (scored ? rows - 1 : 0) * V;  // the sequence's last row
  const int32_t token = a.sampler.sample(row, sample_vocab_, allowed, image_pad_id_ < sample_vocab_ ? image_pad_id_ : -1);
  record_token(a, token, row, prefilling, batch.returned);
  const std::optional<FinishReason> reason = stream_token(a, token);
  if (!reason) {
    a.next = token;
    return false;
  }
  a.output.finish_reason = *reason;
  return true;
}

// Row j of a scored chunk predicts prompt token prefilled + j + 1.
void Scheduler::score_prompt_rows(Active& a, const float* rows, int64_t count) const {
  const int64_t V = model_->config().vocab_size;
  for (int64_t j = 0; j < count && a.prefilled + j + 1 < int64_t(a.request.prompt.size()); ++j) {
    std::vector<TokenLogprob> best;
    a.output.prompt_logprobs.push_back(log_probability(rows + j * V, V, a.request.prompt[size_t(a.prefilled + j + 1)],
                                                       a.request.top_logprobs, &best));
    if (a.request.top_logprobs > 0) a.output.prompt_top_logprobs.push_back(std::move(best));
  }
}

// Returns whether the whole prompt is read.
bool Scheduler::read_prompt_chunk(Active& a, int64_t count) {
  a.prefilled += count;
  // Snapshots at every interval and before the prompt's last token: a request with the same
  // prompt (a group of rollouts, n choices, a retry) restores all of it but the token whose
  // logits it needs, instead of re-reading its last partial interval.
  const int64_t size = int64_t(a.request.prompt.size());
  if ((a.prefilled % prefix_cache_.interval() == 0 && a.prefilled < size) || a.prefilled == size - 1)
    prefix_cache_.store(a.request.prompt, a.images, a.prefilled, *slots_[size_t(a.slot)], a.snapshots);
  return a.prefilled >= size;
}

// The tokens a's grammar allows next, or nullptr when the request ends here: its grammar failed
// (a.error) or no token continues it.
const uint8_t* Scheduler::grammar_mask(Active& a) {
  if (!grammar_vocabulary_) grammar_vocabulary_ = std::make_unique<GrammarVocabulary>(tokenizer_);
  a.allowed.resize(size_t(grammar_vocabulary_->size()));
  try {
    a.grammar->allowed(*grammar_vocabulary_, a.allowed.data());
  } catch (const Error& e) {  // the grammar's own limits (too many parses, too deep): this request fails
    a.error = std::make_exception_ptr(Error(fmt::format("constrained sampling stopped: {}", e.what())));
    return nullptr;
  }
  if (a.request.stop_at_end_tokens && a.grammar->can_end())
    for (const int32_t id : end_ids_) a.allowed[size_t(id)] = 1;
  if (image_pad_id_ >= 0 && image_pad_id_ < sample_vocab_) a.allowed[size_t(image_pad_id_)] = 0;
  if (std::find(a.allowed.begin(), a.allowed.begin() + sample_vocab_, 1) == a.allowed.begin() + sample_vocab_) {
    // No token of this vocabulary continues the grammar: the output is as complete as it gets.
    a.output.finish_reason = FinishReason::Length;
    return nullptr;
  }
  return a.allowed.data();
}

// Keeps the token, its log-probabilities (from its logits row) and its latency.
void Scheduler::record_token(Active& a, int32_t token, const float* row, bool first_token, Clock::time_point now) {
  if (first_token) {
    a.output.time_to_first_token = seconds_between(a.start, now);
    stats_.ttft.observe(a.output.time_to_first_token);
  } else {
    stats_.itl.observe(seconds_between(a.last, now));
  }
  a.last = now;
  a.output.tokens.push_back(token);
  if (a.request.logprobs) {
    std::vector<TokenLogprob> best;
    a.output.token_logprobs.push_back(log_probability(row, model_->config().vocab_size, token, a.request.top_logprobs,
                                                      &best));
    if (a.request.top_logprobs > 0) a.output.top_logprobs.push_back(std::move(best));
  }
  ++stats_.generated_tokens;
}

// Ends the request at an end token; otherwise moves its grammar on (or arms it at grammar_after)
// and streams the token's text. Returns why the request ends here, if it does.
std::optional<FinishReason> Scheduler::stream_token(Active& a, int32_t token) {
  if (a.request.stop_at_end_tokens && std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end())
    return FinishReason::Stop;
  if (a.grammar) {
    // The mask already computed (and remembered) every byte transition this token takes.
    const bool taken = tokenizer_.is_special(token) ? a.grammar->accept_special(token)
                                                    : a.grammar->accept_bytes(tokenizer_.decode_token(token));
    HYLA_ASSERT(taken);  // the mask allowed only tokens some parse takes
  } else if (a.request.grammar && token == a.request.grammar_after) {
    a.grammar.emplace(*a.request.grammar);
  }
  const std::string piece = a.text.push(tokenizer_.decode_token(token));
  if (!piece.empty() && a.request.on_text && !a.request.on_text(piece)) return FinishReason::Cancelled;
  if (a.text.stopped() || (a.grammar && !a.grammar->can_continue())) return FinishReason::Stop;
  const SequenceState& state = *slots_[size_t(a.slot)];
  if (int64_t(a.output.tokens.size()) >= a.request.max_tokens || state.length() + 1 >= state.capacity())
    return FinishReason::Length;
  return std::nullopt;
}

void Scheduler::finish(Active& a, FinishReason reason, std::vector<Finished>& finished) {
  a.output.finish_reason = reason;
  // Text held back as a possible stop string is final unless a stop string did appear.
  if (reason != FinishReason::Cancelled && !a.text.stopped()) {
    const std::string rest = a.text.flush();
    if (!rest.empty() && a.request.on_text) a.request.on_text(rest);
  }
  a.output.text = a.text.text();
  a.output.stop_sequence = a.text.stop_found();
  if (a.slot >= 0) {
    const SequenceState& state = *slots_[size_t(a.slot)];
    SlotHistory& h = history_[size_t(a.slot)];
    h = {.last_use = ++slot_clock_, .last_request = a.id, .prompt_tokens = a.output.prompt_tokens,
         .cached_prompt_tokens = a.output.cached_prompt_tokens, .generated_tokens = int64_t(a.output.tokens.size()),
         .max_tokens = a.request.max_tokens};
    // The state holds the prompt and the reply but its last token (sampled, never fed), or, cut
    // off during its prefill, part of the prompt: whole tokens either way, unless it failed.
    const int64_t length = state.length();
    if (!a.error && length <= h.prompt_tokens + h.generated_tokens) {
      h.tokens.assign(a.request.prompt.begin(), a.request.prompt.begin() + std::min(length, h.prompt_tokens));
      h.tokens.insert(h.tokens.end(), a.output.tokens.begin(), a.output.tokens.begin() + (length - int64_t(h.tokens.size())));
      for (const PromptInput& in : a.images)
        if (in.row < length) h.inputs.push_back(in);
      // The turn's end: the next turn of a conversation re-sends these tokens and reads only what follows.
      if (prefix_cache_.enabled() && reason != FinishReason::Cancelled && length > 0)
        prefix_cache_.store(h.tokens, h.inputs, length, state, a.snapshots);
    }
  }
  a.output.seconds = seconds_between(a.start, Clock::now());
  finished.push_back({a.id, std::move(a.output), a.error});
  ++stats_.finished[size_t(reason)];
  if (a.slot >= 0) slot_used_[size_t(a.slot)] = false;
  std::erase_if(running_, [&](const std::unique_ptr<Active>& p) { return p.get() == &a; });
}

int Scheduler::checked_slot(int slot) const {
  HYLA_CHECK(slot >= 0 && slot < int(slots_.size()), "no slot {}: this server has slots 0 to {}", slot,
             int(slots_.size()) - 1);
  return slot;
}

bool Scheduler::slot_busy(int slot) const { return slot >= 0 && slot < int(slots_.size()) && slot_used_[size_t(slot)]; }

std::vector<Scheduler::SlotInfo> Scheduler::slots() const {
  std::vector<SlotInfo> infos;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const SlotHistory& h = history_[i];
    SlotInfo& info = infos.emplace_back(SlotInfo{.id = int(i), .processing = bool(slot_used_[i]),
                                                 .tokens = int64_t(h.tokens.size()), .request = h.last_request,
                                                 .prompt_tokens = h.prompt_tokens,
                                                 .cached_prompt_tokens = h.cached_prompt_tokens,
                                                 .generated_tokens = h.generated_tokens, .max_tokens = h.max_tokens});
    if (!info.processing) continue;
    for (const auto& a : running_)
      if (a->slot == int(i)) {
        info.tokens = slots_[i]->length();
        info.request = a->id;
        info.prompt_tokens = a->output.prompt_tokens;
        info.cached_prompt_tokens = a->output.cached_prompt_tokens;
        info.generated_tokens = int64_t(a->output.tokens.size());
        info.max_tokens = a->request.max_tokens;
      }
  }
  return infos;
}

namespace {

void check_free(bool busy, int slot) {
  HYLA_CHECK(!busy, "slot {} is processing a request; wait for it to finish", slot);
}

}  // namespace

Scheduler::SlotTransfer Scheduler::save_slot(int slot, const std::filesystem::path& file) {
  check_free(slot_busy(checked_slot(slot)), slot);
  const Clock::time_point start = Clock::now();
  SlotHistory& h = history_[size_t(slot)];
  SequenceState& state = *slots_[size_t(slot)];
  if (h.tokens.empty()) state.reset();  // nothing whole is held: an empty state is saved
  SlotTransfer t;
  t.tokens = int64_t(h.tokens.size());
  t.bytes = save_slot_file(file, model_fingerprint(*model_), h.tokens, h.inputs, state);
  t.seconds = seconds_between(start, Clock::now());
  return t;
}

Scheduler::SlotTransfer Scheduler::restore_slot(int slot, const std::filesystem::path& file) {
  check_free(slot_busy(checked_slot(slot)), slot);
  const Clock::time_point start = Clock::now();
  SlotTransfer t;
  SlotContents contents =
      load_slot_file(file, model_fingerprint(*model_), model_->config().vocab_size, *slots_[size_t(slot)], &t.bytes);
  history_[size_t(slot)] = {.tokens = std::move(contents.tokens), .inputs = std::move(contents.inputs),
                            .restored = true, .last_use = ++slot_clock_};
  t.tokens = int64_t(history_[size_t(slot)].tokens.size());
  t.seconds = seconds_between(start, Clock::now());
  return t;
}

int64_t Scheduler::erase_slot(int slot) {
  check_free(slot_busy(checked_slot(slot)), slot);
  const int64_t tokens = int64_t(history_[size_t(slot)].tokens.size());
  history_[size_t(slot)] = {};
  slots_[size_t(slot)]->reset();
  return tokens;
}

}  // namespace hyla
