// Inference: decode after prefill equals one full forward (every layer type, AttnRes on and
// off); the engine's batched continuous decoding equals one request at a time; prompt-state reuse
// gives identical outputs; stop strings, max_tokens, cancellation, logprobs; the text stream.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "hyla/data/chat_template.h"
#include "hyla/data/utf8.h"
#include "hyla/infer/engine.h"
#include "hyla/io/json_fields.h"
#include "hyla/infer/json_grammar.h"
#include "hyla/infer/prefix_cache.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/infer/text_stream.h"
#include "model_test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using json = nlohmann::json;

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(int32_t(rng() % uint32_t(vocab)));
  return ids;
}

// max |a − b| / max |b| over n values.
double relative_diff(const float* a, const float* b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, double(std::fabs(a[i] - b[i]))), s = std::max(s, double(std::fabs(b[i])));
  return d / s;
}

// The f32 logits of every row of one sequence, in one full forward: the reference of the cached paths.
Tensor full_forward_logits(Model& model, const std::vector<int32_t>& ids) {
  ModelInput full;
  full.ids = ids;
  full.tokens = TokenBatch::uniform(1, int64_t(ids.size()));
  return model.forward(full, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
}

// Prefill in uneven chunks, then decode token by token, through the model's cached forward with
// f32 caches: every position's logits equal the full forward's row.
TEST(Inference, DecodeAfterPrefillEqualsFullForward) {
  const std::vector<std::pair<std::string, std::function<void(json&)>>> variants = {
      {"nano (kda, mla with RoPE, swa, AttnRes)", {}},
      {"pre-norm, q_lora, NoPE, softplus, latent MoE",
       [](json& j) {
         j["attn_res"]["enabled"] = false;
         j["mla"]["q_lora_rank"] = 16;
         j["mla"]["qk_rope_head_dim"] = 0;
         j["kda"]["gate"] = "softplus";
         j["moe"]["latent_dim"] = 32;
       }},
      {"attn_res block 1", [](json& j) { j["attn_res"]["block_size"] = 1; }},
  };
  for (const auto& [name, edit] : variants) {
    const ModelConfig config = test::nano_config(edit);
    Model model(config);
    test::randomize_params(model.params(), 5);
    const std::vector<int32_t> ids = random_ids(45, config.vocab_size, 8);
    const Tensor reference = full_forward_logits(model, ids);
    SequenceState state(model, 64, DType::F32);
    size_t at = 0;
    for (size_t n : {7u, 16u, 1u, 9u}) {
      const Tensor logits = feed(model, std::vector<int32_t>(ids.begin() + int64_t(at), ids.begin() + int64_t(at + n)), state,
                                 64, Precision::F32);
      at += n;
      EXPECT_LT(relative_diff(logits.data<float>(), reference.data<float>() + int64_t(at - 1) * config.vocab_size,
                              config.vocab_size), 1e-4) << name << " after " << at;
    }
    for (; at < ids.size(); ++at) {
      const Tensor logits = feed(model, {ids[at]}, state, 64, Precision::F32);
      EXPECT_LT(relative_diff(logits.data<float>(), reference.data<float>() + int64_t(at) * config.vocab_size,
                              config.vocab_size), 1e-4) << name << " decode " << at;
    }
    EXPECT_EQ(state.length(), int64_t(ids.size()));
  }
}

// Outputs::All through the cached path: every token of a long prompt, fed in uneven chunks (as the
// engine's chunked prefill does), is scored like one full forward, and Outputs::Rows picks rows.
TEST(Inference, ChunkedCachedForwardScoresEveryTokenLikeOneFullForward) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  test::randomize_params(model.params(), 6);
  const std::vector<int32_t> ids = random_ids(300, config.vocab_size, 9);
  const Tensor reference = full_forward_logits(model, ids);
  const int64_t V = config.vocab_size;
  SequenceState state(model, 512, DType::F32);
  int64_t at = 0;
  for (int64_t n : {64, 1, 100, 37, 98}) {
    ModelInput chunk;
    chunk.ids.assign(ids.begin() + at, ids.begin() + at + n);
    chunk.tokens = TokenBatch::packed({n}, {at});
    const Tensor logits =
        model.forward(chunk, {.precision = Precision::F32, .outputs = Outputs::All}, {&state.cache(), 1}).logits;
    ASSERT_EQ(logits.shape()[0], n);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_LT(relative_diff(logits.data<float>() + i * V, reference.data<float>() + (at + i) * V, V), 1e-4)
          << "position " << at + i;
    at += n;
  }
  EXPECT_EQ(at, int64_t(ids.size()));
  ModelInput full;
  full.ids = ids;
  full.tokens = TokenBatch::uniform(1, int64_t(ids.size()));
  const Tensor picked =
      model.forward(full, {.precision = Precision::F32, .outputs = Outputs::Rows, .rows = {299, 0, 150}}).logits;
  const std::vector<int64_t> rows = {299, 0, 150};
  for (size_t i = 0; i < rows.size(); ++i)  // the same rows through a smaller LM-head product
    EXPECT_LT(relative_diff(picked.data<float>() + int64_t(i) * V, reference.data<float>() + rows[i] * V, V), 1e-6);
}

// A sequence's state copied (forked) mid-way continues exactly as the original: the basis of
// prompt-state reuse and of sampling groups that share a prompt.
TEST(Inference, AForkedSequenceStateContinuesIdentically) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  test::randomize_params(model.params(), 7);
  const std::vector<int32_t> prompt = random_ids(40, config.vocab_size, 10), rest = random_ids(12, config.vocab_size, 11);
  SequenceState original(model, 128), fork(model, 128);
  feed(model, prompt, original, 16, Precision::BF16);
  fork.copy_from(original);
  for (int32_t id : rest) {
    const Tensor a = feed(model, {id}, original, 16, Precision::BF16), b = feed(model, {id}, fork, 16, Precision::BF16);
    ASSERT_EQ(std::memcmp(a.data<float>(), b.data<float>(), size_t(config.vocab_size) * 4), 0);
  }
  EXPECT_EQ(original.length(), fork.length());
}

TEST(Inference, StateMemoryMatchesTheArithmetic) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  SequenceState state(model, 1000);
  // KDA (layers 0, 2): conv tails 3·(kernel−1)·H·K and states H·K·K, f32.
  const int64_t kda = 2 * (3 * 3 * 2 * 16 + 2 * 16 * 16) * 4;
  // Latent attention (layers 1, 3): (kv_lora_rank + qk_rope_head_dim) bf16 values per token.
  EXPECT_EQ(state.fixed_bytes(), kda);
  EXPECT_EQ(state.bytes_per_token(), 2 * (32 + 8) * 2);
  EXPECT_EQ(state.bytes_at(1000), kda + 1000 * 2 * (32 + 8) * 2);
  EXPECT_EQ(state.describe_memory(1000),
            "0.01 MiB fixed (KDA states and conv tails) + 160 B per token (latent cache, BF16) = 0.16 MiB at 1000 tokens");
}

// Feeds ids[from, to) in chunks that end at multiples of `interval`, as the scheduler's prefill does.
void feed_to(Model& model, const std::vector<int32_t>& ids, int64_t to, int64_t interval, SequenceState& state) {
  while (state.length() < to) {
    const int64_t from = state.length(), end = std::min(to, (from / interval + 1) * interval);
    feed(model, std::vector<int32_t>(ids.begin() + from, ids.begin() + end), state, interval, Precision::F32);
  }
}

// Snapshots along a prompt cost its latent rows once plus one recurrent state each, and a restored
// prefix continues bit for bit like the state that read the whole prompt.
TEST(PromptStates, ARestoredPrefixContinuesLikeTheColdStateAndMemoryIsLinear) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  test::randomize_params(model.params(), 12);
  const int64_t interval = 16;
  const std::vector<int32_t> first = random_ids(200, config.vocab_size, 13);
  PrefixCache cache(int64_t(64) << 20, interval);
  SequenceState state(model, 256, DType::F32);
  PrefixCache::Cursor cursor;
  for (int64_t at = interval; at <= 200; at += interval) {
    feed_to(model, first, at, interval, state);
    cache.store(first, {}, at, state, cursor);
  }
  EXPECT_EQ(cache.snapshots(), 12);
  const int64_t rows = 192 * state.bytes_per_token(), states = 12 * state.fixed_bytes();
  EXPECT_GE(cache.bytes(), rows + states);
  EXPECT_LE(cache.bytes(), rows + states + 192 * 4 + 12 * 512);  // token ids and bookkeeping

  // A second prompt sharing 150 tokens: restored at 144, the rest read, logits equal to cold.
  std::vector<int32_t> second(first.begin(), first.begin() + 150);
  for (int32_t id : random_ids(30, config.vocab_size, 14)) second.push_back(id);
  SequenceState warm(model, 256, DType::F32), cold(model, 256, DType::F32);
  PrefixCache::Cursor second_cursor;
  ASSERT_EQ(cache.restore(second, {}, warm, second_cursor), 144);
  EXPECT_EQ(warm.length(), 144);
  feed_to(model, second, 144, interval, cold);
  const std::vector<int32_t> rest(second.begin() + 144, second.end());
  const Tensor a = feed(model, rest, warm, 64, Precision::F32), b = feed(model, rest, cold, 64, Precision::F32);
  EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), size_t(config.vocab_size) * 4), 0);
  // Storing a snapshot that exists, from another request, adds nothing.
  const int64_t bytes = cache.bytes();
  SequenceState again(model, 256, DType::F32);
  PrefixCache::Cursor fresh;
  feed_to(model, first, 64, interval, again);
  cache.store(first, {}, 64, again, fresh);
  EXPECT_EQ(cache.bytes(), bytes);
  EXPECT_EQ(cache.snapshots(), 12);
  // The root prefix is never restored: the last token must still be read.
  PrefixCache::Cursor short_cursor;
  SequenceState empty(model, 256, DType::F32);
  EXPECT_EQ(cache.restore(std::vector<int32_t>(first.begin(), first.begin() + 16), {}, empty, short_cursor), 0);
  EXPECT_EQ(empty.length(), 0);
}

// Over budget, the least recently used leaves go first, so what remains of a prompt's chain is a
// prefix of it that still restores exactly.
TEST(PromptStates, EvictionTakesLeastRecentlyUsedLeavesAndKeepsTheirAncestors) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  test::randomize_params(model.params(), 15);
  const int64_t interval = 16;
  std::vector<int32_t> a = random_ids(200, config.vocab_size, 16), b = random_ids(80, config.vocab_size, 17);
  b[0] = (a[0] + 1) % int32_t(config.vocab_size);  // no shared prefix
  auto store_chain = [&](PrefixCache& cache, const std::vector<int32_t>& ids, int64_t to) {
    SequenceState state(model, 256, DType::F32);
    PrefixCache::Cursor cursor;
    for (int64_t at = interval; at <= to; at += interval) {
      feed_to(model, ids, at, interval, state);
      cache.store(ids, {}, at, state, cursor);
    }
  };
  int64_t chain_bytes = 0;
  {
    PrefixCache probe(int64_t(1) << 30, interval);
    store_chain(probe, a, 192);
    chain_bytes = probe.bytes();
  }
  PrefixCache cache(chain_bytes, interval);
  store_chain(cache, a, 192);
  EXPECT_EQ(cache.snapshots(), 12);
  store_chain(cache, b, 64);  // four nodes of b push out a's last four
  EXPECT_EQ(cache.snapshots(), 12);
  SequenceState warm(model, 256, DType::F32), cold(model, 256, DType::F32);
  PrefixCache::Cursor cursor;
  ASSERT_EQ(cache.restore(a, {}, warm, cursor), 128);
  feed_to(model, a, 128, interval, cold);
  const std::vector<int32_t> rest(a.begin() + 128, a.end());
  const Tensor x = feed(model, rest, warm, 64, Precision::F32), y = feed(model, rest, cold, 64, Precision::F32);
  EXPECT_EQ(std::memcmp(x.data<float>(), y.data<float>(), size_t(config.vocab_size) * 4), 0);
  // A chain longer than the whole budget keeps its beginning: a node never evicts its own parent.
  PrefixCache small(chain_bytes / 2, interval);
  store_chain(small, a, 192);
  EXPECT_EQ(small.snapshots(), 6);
  SequenceState part(model, 256, DType::F32);
  EXPECT_EQ(small.restore(a, {}, part, cursor), 96);
}

struct EngineFixture {
  ModelConfig config = test::nano_config([](json& j) { j["vocab_size"] = 512; });
  Model model{config};
  const Tokenizer& tokenizer = test::small_tokenizer();
  EngineFixture() { test::randomize_params(model.params(), 3); }
  GenerationRequest request(const std::string& text, int64_t max_tokens) {
    GenerationRequest r;
    r.prompt = tokenizer.encode(text);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.stop_at_end_tokens = false;
    return r;
  }
  // f32 products and caches: results comparable bit for bit across batchings.
  static EngineOptions exact(int64_t slots, int64_t context, int64_t prefill_chunk) {
    EngineOptions o;
    o.max_sequences = slots;
    o.context = context;
    o.prefill_chunk = prefill_chunk;
    o.precision = Precision::F32;
    o.latent_dtype = DType::F32;
    return o;
  }
};

TEST(Engine, ConcurrentRequestsMatchOneAtATime) {
  EngineFixture f;
  EngineOptions one = EngineFixture::exact(1, 256, 8);
  one.prefix_cache_bytes = 0;
  std::vector<std::string> prompts = {"The quick brown fox", "A different prompt that is a little longer than the first",
                                      "x", "Numbers 1234 and words", "The quick brown fox jumps"};
  std::vector<std::vector<int32_t>> expected;
  {
    Engine engine(f.model, f.tokenizer, one);
    for (const auto& p : prompts) expected.push_back(engine.submit(f.request(p, 12)).get().tokens);
  }
  EngineOptions many = one;
  many.max_sequences = 3;  // fewer slots than requests: some wait, all share batched decode
  Engine engine(f.model, f.tokenizer, many);
  std::vector<std::future<GenerationOutput>> futures;
  for (const auto& p : prompts) futures.push_back(engine.submit(f.request(p, 12)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerationOutput out = futures[i].get();
    EXPECT_EQ(out.tokens, expected[i]) << prompts[i];
    EXPECT_EQ(out.finish_reason, FinishReason::Length);
  }
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.generated_tokens, 5 * 12);
}

// <|image_pad|> rows are a request's image patches: a model never generates one, even when it
// is by far the likeliest token (a generated pad would make the conversation's next prompt
// invalid: an agent evaluation once stopped on it).
TEST(Engine, NeverGeneratesAnImagePad) {
  EngineFixture f;
  Engine engine(f.model, f.tokenizer, EngineFixture::exact(1, 256, 8));
  const int32_t pad = f.tokenizer.special_id("<|image_pad|>");
  for (const float temperature : {0.0f, 1.0f}) {
    GenerationRequest r = f.request("The quick brown fox", 12);
    r.sampling.temperature = temperature;
    r.sampling.logit_bias = {{pad, 100.0f}};
    const GenerationOutput out = engine.submit(r).get();
    EXPECT_EQ(out.tokens.size(), 12u);
    EXPECT_EQ(std::count(out.tokens.begin(), out.tokens.end(), pad), 0) << "temperature " << temperature;
  }
}

TEST(Engine, PromptStateReuseGivesIdenticalOutputs) {
  EngineFixture f;
  EngineOptions o = EngineFixture::exact(2, 512, 16);
  const std::string shared = test::sample_text(4, 9);  // a long shared prefix
  GenerationRequest a = f.request(shared + " first question", 10), b = f.request(shared + " second one", 10);
  ASSERT_GT(a.prompt.size(), 48u);
  o.prefix_cache_bytes = 0;
  std::vector<int32_t> cold_b;
  {
    Engine cold(f.model, f.tokenizer, o);
    cold_b = cold.submit(b).get().tokens;
  }
  o.prefix_cache_bytes = int64_t(64) << 20;
  o.snapshot_interval = 16;
  Engine warm(f.model, f.tokenizer, o);
  const GenerationOutput first = warm.submit(a).get();
  EXPECT_EQ(first.cached_prompt_tokens, 0);
  const GenerationOutput second = warm.submit(b).get();
  EXPECT_GT(second.cached_prompt_tokens, 0);  // the shared prefix came from the cache
  EXPECT_EQ(second.cached_prompt_tokens % 16, 0);
  EXPECT_EQ(second.tokens, cold_b);
}

// A conversation's next turn re-sends the last one with its answer: the snapshot at the end of a
// turn means only the tokens after it are read (the answer's last token was never fed), and the
// reply is the one a cold engine gives, whatever the snapshot interval.
TEST(Engine, ASecondTurnReadsOnlyWhatFollowsTheFirst) {
  EngineFixture f;
  for (const int64_t interval : {int64_t(16), int64_t(64)}) {
    EngineOptions o = EngineFixture::exact(1, 512, 32);
    o.prefix_cache_bytes = int64_t(64) << 20;
    o.snapshot_interval = interval;
    GenerationRequest turn1 = f.request(test::sample_text(4, 21) + " first question", 9);
    Engine warm(f.model, f.tokenizer, o);
    const GenerationOutput one = warm.submit(turn1).get();
    GenerationRequest turn2 = turn1;
    turn2.prompt.insert(turn2.prompt.end(), one.tokens.begin(), one.tokens.end());
    const std::vector<int32_t> question = f.tokenizer.encode(" and a second question");
    turn2.prompt.insert(turn2.prompt.end(), question.begin(), question.end());
    const GenerationOutput two = warm.submit(turn2).get();
    EXPECT_EQ(two.cached_prompt_tokens, int64_t(turn1.prompt.size() + one.tokens.size()) - 1) << interval;
    EngineOptions cold_options = o;
    cold_options.prefix_cache_bytes = 0;
    Engine cold(f.model, f.tokenizer, cold_options);
    EXPECT_EQ(two.tokens, cold.submit(turn2).get().tokens) << interval;
  }
}

// The same prompt again (a group of rollouts, n choices, a retry) restores all of it but the last
// token, whatever the interval, and continues exactly like a cold start.
TEST(Engine, AnEqualPromptRereadsOnlyItsLastToken) {
  EngineFixture f;
  EngineOptions o = EngineFixture::exact(1, 512, 32);
  o.prefix_cache_bytes = int64_t(64) << 20;
  o.snapshot_interval = 64;
  const GenerationRequest r = f.request(test::sample_text(5, 8) + " the same prompt", 6);
  ASSERT_GT(r.prompt.size() % 64, 1u);
  Engine warm(f.model, f.tokenizer, o);
  const GenerationOutput first = warm.submit(r).get();
  const GenerationOutput again = warm.submit(r).get();
  EXPECT_EQ(first.cached_prompt_tokens, 0);
  EXPECT_EQ(again.cached_prompt_tokens, int64_t(r.prompt.size()) - 1);
  EXPECT_EQ(again.tokens, first.tokens);
}

// Issue 67: multi-turn Kimi K3 and Kimi Linear conversations (reasoning sent back, a tool turn, an
// edit in the middle of the history) through one engine with the prompt-state cache. Every turn
// restores only a prefix the new prompt shares with what the engine read before (never a cut-off
// one: llama.cpp's cache reuse restored a KDA state that did not match the reused prefix), and
// continues as a fresh engine does: the same tokens, log-probabilities within f32 chunking noise.
TEST(Engine, KimiConversationsReuseOnlySharedPrefixesAndContinueExactly) {
  for (const bool k3 : {true, false}) {
    const Tokenizer tokenizer = test::kimi_tokenizer(k3);
    const std::unique_ptr<Model> random = test::random_kimi_tiny(k3, tokenizer.vocab_size(), 7);
    Model& model = *random;
    const ChatTemplate chat(tokenizer);
    ChatOptions options;
    options.tools = {R"({"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}})"};
    EngineOptions o = EngineFixture::exact(1, 4096, 32);
    o.prefix_cache_bytes = int64_t(64) << 20;
    o.snapshot_interval = 16;
    EngineOptions cold_options = o;
    cold_options.prefix_cache_bytes = 0;
    Engine warm(model, tokenizer, o);
    std::vector<std::vector<int32_t>> read;  // every sequence the warm engine's cache may hold
    std::vector<ChatMessage> messages = {{"system", "You are terse."}, {"user", test::sample_text(1, 3)}};
    const auto turn = [&](const std::string& what) {
      GenerationRequest r;
      r.prompt = chat.encode(messages, /*add_generation_prompt=*/true, options);
      r.max_tokens = 6;
      r.sampling.temperature = 0;
      r.stop_at_end_tokens = false;
      r.logprobs = true;
      const GenerationOutput w = warm.submit(r).get();
      Engine cold(model, tokenizer, cold_options);
      const GenerationOutput c = cold.submit(r).get();
      EXPECT_EQ(w.tokens, c.tokens) << (k3 ? "k3 " : "linear ") << what;
      for (size_t i = 0; i < std::min(w.token_logprobs.size(), c.token_logprobs.size()); ++i)
        EXPECT_NEAR(w.token_logprobs[i], c.token_logprobs[i], 1e-4) << what << " token " << i;
      size_t shared = 0;
      for (const std::vector<int32_t>& s : read) {
        size_t n = 0;
        while (n < s.size() && n < r.prompt.size() && s[n] == r.prompt[n]) ++n;
        shared = std::max(shared, n);
      }
      EXPECT_LE(w.cached_prompt_tokens, int64_t(shared)) << what << ": restored past what the prompt shares";
      std::vector<int32_t> sequence = r.prompt;
      sequence.insert(sequence.end(), w.tokens.begin(), w.tokens.end());
      read.push_back(std::move(sequence));
      return w.cached_prompt_tokens;
    };
    EXPECT_EQ(turn("first turn"), 0);
    messages.push_back({"assistant", "Let me look.", {{"lookup", R"({"q": "light"})", "call_1"}}, {}, "They ask; look it up."});
    messages.push_back({"tool", "found: let there be light", {}, {}, {}, "lookup", "call_1"});
    EXPECT_GT(turn("after a tool result"), 0);
    messages.push_back({"assistant", "Done.", {}, {}, "Answered."});
    messages.push_back({"user", "Thanks; and the second day?"});
    const int64_t third = turn("third turn");
    EXPECT_GT(third, 0);
    // An edit in the first user message: only what precedes it (system prompt, tools) is reused.
    messages[1].content = "Another question entirely, " + messages[1].content;
    EXPECT_LT(turn("after an edit"), third);
  }
}

// Issue 67: Kimi K2's forced calls (tool_choice required, or a named tool) are held to the tools'
// schemas by grammar, so even a model with random weights writes a call that parses.
TEST(Engine, ForcedKimiK2CallsParseEvenFromARandomModel) {
  const Tokenizer tokenizer = test::kimi_tokenizer(false);
  const std::unique_ptr<Model> random = test::random_kimi_tiny(false, tokenizer.vocab_size(), 11);
  Model& model = *random;
  const ChatTemplate chat(tokenizer);
  ASSERT_EQ(chat.format(), ChatFormat::KimiK2);
  const json parameters = json::parse(R"({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
      "required": ["city"]})");
  const std::vector<ToolSchema> tools = {{"get_weather", parameters}, {"get_time", json()}};
  ChatOptions offered;
  offered.tools = {R"({"name": "get_weather"})", R"({"name": "get_time"})"};
  const KimiK2CallMarkers markers{tokenizer.special_id("<|tool_call_argument_begin|>"),
                                  tokenizer.special_id("<|tool_call_end|>")};
  Engine engine(model, tokenizer, EngineFixture::exact(2, 1024, 32));
  for (const bool named : {false, true}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const std::string prefix = chat.forced_call_prefix(named ? "get_weather" : "", 0);
      GenerationRequest r;
      r.prompt = chat.encode(std::vector<ChatMessage>{{"user", "Weather in Paris?"}}, true, offered);
      tokenizer.encode_append(prefix, /*allow_special=*/true, r.prompt);
      r.max_tokens = 200;
      r.sampling.temperature = 1;
      r.sampling.seed = seed;
      r.grammar = kimi_k2_call_grammar(named ? std::vector<ToolSchema>{tools[0]} : tools, named, 0, markers);
      const GenerationOutput out = engine.submit(r).get();
      const AssistantReply reply = chat.parse_reply(prefix + out.text, offered);
      ASSERT_EQ(reply.tool_calls.size(), 1u) << prefix + out.text;
      const json arguments = json::parse(reply.tool_calls[0].arguments);
      if (named || reply.tool_calls[0].name == "get_weather") {
        EXPECT_EQ(reply.tool_calls[0].name, "get_weather");
        EXPECT_TRUE(arguments["city"] == "Paris" || arguments["city"] == "Oslo") << out.text;
      } else {
        EXPECT_EQ(reply.tool_calls[0].name, "get_time");
        EXPECT_TRUE(arguments.is_object());
      }
    }
  }
}

// Kimi K3's forced calls are held by kimi_k3_call_grammar: with thinking off from the first token,
// with thinking on once the model closes its think channel (free text until then: a logit bias
// makes this random model close it soon). Every reply parses into calls of offered tools whose
// arguments follow their schemas: an enum, a bounded integer, a string of at most 8 characters.
TEST(Engine, ForcedKimiK3CallsParseEvenFromARandomModel) {
  const Tokenizer tokenizer = test::kimi_tokenizer(true);
  const std::unique_ptr<Model> random = test::random_kimi_tiny(true, tokenizer.vocab_size(), 11);
  Model& model = *random;
  const ChatTemplate chat(tokenizer);
  ASSERT_EQ(chat.format(), ChatFormat::KimiK3);
  const json parameters = json::parse(R"({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
      "days": {"type": "integer"}, "units": {"type": "string", "maxLength": 8}}, "required": ["city"]})");
  const std::vector<ToolSchema> tools = {{"get_weather", parameters}, {"get_time", json()}};
  const KimiK3Markers markers{tokenizer.special_id("<|open|>"), tokenizer.special_id("<|sep|>"),
                              tokenizer.special_id("<|close|>")};
  Engine engine(model, tokenizer, EngineFixture::exact(2, 4096, 32));
  int calls = 0;
  for (const bool thinking : {false, true})
    for (const bool named : {false, true})
      for (uint64_t seed = 0; seed < 3; ++seed) {
        ChatOptions offered;
        offered.tools = {R"({"name": "get_weather"})", R"({"name": "get_time"})"};
        offered.thinking = thinking;
        GenerationRequest r;
        r.prompt = chat.encode(std::vector<ChatMessage>{{"user", "Weather in Paris?"}}, true, offered);
        r.max_tokens = 3000;  // a free object's random keys run long
        r.sampling.temperature = 1;
        r.sampling.seed = seed;
        if (thinking) r.sampling.logit_bias = {{markers.close, 6.0f}};
        r.grammar = kimi_k3_call_grammar(named ? std::vector<ToolSchema>{tools[0]} : tools, thinking, named, markers);
        const GenerationOutput out = engine.submit(r).get();
        const std::string where = fmt::format("thinking {} named {} seed {}: {}", thinking, named, seed, out.text);
        EXPECT_EQ(out.finish_reason, FinishReason::Stop) << where;
        const AssistantReply reply = chat.parse_reply(out.text, offered);
        EXPECT_FALSE(reply.malformed_call) << where;
        ASSERT_GE(reply.tool_calls.size(), 1u) << where;
        if (named) {
          EXPECT_EQ(reply.tool_calls.size(), 1u) << where;
        }
        for (const ToolCall& call : reply.tool_calls) {
          ++calls;
          const json arguments = json::parse(call.arguments);
          ASSERT_TRUE(arguments.is_object()) << where;
          if (call.name == "get_time") {
            EXPECT_FALSE(named) << where;
            continue;
          }
          ASSERT_EQ(call.name, "get_weather") << where;
          EXPECT_TRUE(arguments["city"] == "Paris" || arguments["city"] == "Oslo") << where;
          if (arguments.contains("days")) {
            EXPECT_TRUE(arguments["days"].is_number_integer()) << where;
          }
          if (arguments.contains("units")) {
            EXPECT_LE(std::ranges::count_if(arguments["units"].get<std::string>(),
                                            [](char c) { return (uint8_t(c) & 0xc0) != 0x80; }), 8) << where;
          }
        }
      }
  EXPECT_GE(calls, 12);
}

TEST(Engine, RefusesAContextPastTheWindowOrOverTheMemoryBudget) {
  EngineFixture f;
  EngineOptions o = EngineFixture::exact(4, f.config.max_position_embeddings + 1, 16);
  test::expect_error([&] { Engine e(f.model, f.tokenizer, o); },
                                fmt::format("exceeds the model's window ({} tokens", f.config.max_position_embeddings));
  o.context = 4096;
  o.prefix_cache_bytes = 0;
  const SequenceState probe(f.model, 4096, DType::F32);
  o.memory_budget = 3 * probe.bytes_at(4096) + 100;
  test::expect_error([&] { Engine e(f.model, f.tokenizer, o); },
                                "3 sequences fit at this context, or 4 sequences fit at a context of");
  o.max_sequences = 3;
  Engine fits(f.model, f.tokenizer, o);
  EXPECT_EQ(fits.submit(f.request("fits", 2)).get().tokens.size(), 2u);
}

// A vision model (nano, 7×7 grey patches) and prompts that carry images.
struct VisionFixture : EngineFixture {
  VisionFixture() {
    config = test::nano_config([](json& j) {
      j["vocab_size"] = 512;
      j["vision"]["enabled"] = true;
    });
    vision_model = std::make_unique<Model>(config);
    test::randomize_params(vision_model->params(), 4);
  }
  std::unique_ptr<Model> vision_model;
  static Image image(int64_t h, int64_t w, uint8_t seed) {
    Image img{h, w, 1, std::vector<uint8_t>(size_t(h * w))};
    for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = uint8_t(i * 37 + seed * 101);
    return img;
  }
  // text, then one <|image_start|> pads <|image_end|> span per image, then more text.
  GenerationRequest with_images(const std::string& before, const std::vector<Image>& images, const std::string& after,
                                int64_t max_tokens) {
    GenerationRequest r = request(before, max_tokens);
    for (const Image& img : images) {
      r.prompt.push_back(tokenizer.special_id("<|image_start|>"));
      r.prompt.insert(r.prompt.end(), size_t(img.height / 7 * (img.width / 7)), tokenizer.special_id("<|image_pad|>"));
      r.prompt.push_back(tokenizer.special_id("<|image_end|>"));
    }
    const std::vector<int32_t> tail = tokenizer.encode(after);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.images = images;
    return r;
  }
};

// An image's pad tokens are the same for every image of its size: the prefix cache keys on the
// images' content, so a prompt whose image differs never starts from another image's state.
TEST(Engine, PrefixCacheKeyCoversImages) {
  VisionFixture f;
  EngineOptions o = EngineFixture::exact(1, 512, 16);
  o.prefix_cache_bytes = int64_t(64) << 20;
  o.snapshot_interval = 16;
  const std::string shared = test::sample_text(4, 9);
  const Image first = VisionFixture::image(14, 14, 1), second = VisionFixture::image(14, 14, 2);
  GenerationRequest a = f.with_images("Look:", {first}, shared + " first question", 4);
  GenerationRequest b = f.with_images("Look:", {second}, shared + " first question", 4);
  std::vector<int32_t> cold_b;
  {
    EngineOptions cold = o;
    cold.prefix_cache_bytes = 0;
    Engine engine(*f.vision_model, f.tokenizer, cold);
    cold_b = engine.submit(b).get().tokens;
  }
  Engine engine(*f.vision_model, f.tokenizer, o);
  EXPECT_EQ(engine.submit(a).get().cached_prompt_tokens, 0);
  const GenerationOutput other_image = engine.submit(b).get();
  EXPECT_EQ(other_image.cached_prompt_tokens, 0);  // same tokens, another image
  EXPECT_EQ(other_image.tokens, cold_b);
  const GenerationOutput again = engine.submit(b).get();
  EXPECT_GT(again.cached_prompt_tokens, 0);  // the same image: reused, with the same output
  EXPECT_EQ(again.tokens, cold_b);
}

// However the prompt is chunked, an image is never split and every prompt token's log-probability
// equals one full forward's (the model reads all of an image's patches in one call).
TEST(Engine, ChunkedPrefillWithImagesScoresAsOneForward) {
  VisionFixture f;
  const std::vector<Image> images = {VisionFixture::image(21, 28, 3), VisionFixture::image(7, 14, 4),
                                     VisionFixture::image(28, 28, 5)};
  GenerationRequest r = f.with_images("An image", images, " and words after it, several of them", 0);
  r.prompt_logprobs = true;
  ModelInput full;
  full.ids = r.prompt;
  full.tokens = TokenBatch::uniform(1, int64_t(r.prompt.size()));
  full.images = images;
  full.image_pad_id = f.tokenizer.special_id("<|image_pad|>");
  const Tensor logits = f.vision_model->forward(full, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
  const int64_t V = f.config.vocab_size;
  for (int64_t chunk : {3, 5, 16, 512}) {
    Engine engine(*f.vision_model, f.tokenizer, EngineFixture::exact(1, 512, chunk));
    const GenerationOutput out = engine.submit(r).get();
    ASSERT_EQ(out.prompt_logprobs.size(), r.prompt.size()) << chunk;
    for (size_t t = 1; t < r.prompt.size(); ++t) {
      const float* row = logits.data<float>() + int64_t(t - 1) * V;
      double m = row[0], z = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, double(row[v]));
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - m);
      const double expected = double(row[r.prompt[t]]) - m - std::log(z);
      EXPECT_NEAR(out.prompt_logprobs[t], expected, 1e-4) << "chunk " << chunk << " token " << t;
    }
  }
}

TEST(Engine, ImagesThatDoNotMatchThePromptAreRefused) {
  VisionFixture f;
  Engine engine(*f.vision_model, f.tokenizer, EngineFixture::exact(1, 512, 16));
  GenerationRequest r = f.with_images("x", {VisionFixture::image(14, 14, 1)}, "y", 2);
  auto refused = [&](GenerationRequest bad, const std::string& words) {
    try {
      engine.submit(std::move(bad)).get();
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  GenerationRequest no_image = r;
  no_image.images.clear();
  refused(no_image, "<|image_pad|> tokens but no images");
  GenerationRequest two = r;
  two.images.push_back(VisionFixture::image(7, 7, 2));
  refused(two, "consecutive <|image_pad|>");
  GenerationRequest odd = r;
  odd.images[0] = VisionFixture::image(14, 15, 1);
  refused(odd, "whole number of 7x7 patches");
  GenerationRequest wide = f.with_images("x", {VisionFixture::image(7, 63, 1)}, "y", 2);
  refused(wide, "vision.max_grid");
  GenerationRequest text_model = r;
  Engine plain(f.model, f.tokenizer, EngineFixture::exact(1, 512, 16));
  EXPECT_THROW(plain.submit(text_model).get(), Error);
  EXPECT_EQ(engine.submit(r).get().tokens.size(), 2u);  // the engine still serves
}

TEST(Engine, UnusableSamplingIsRefusedAtSubmit) {
  EngineFixture f;
  Engine engine(f.model, f.tokenizer, EngineFixture::exact(1, 256, 16));
  GenerationRequest r = f.request("The quick brown fox", 4);
  r.sampling.temperature = std::nan("");
  EXPECT_THROW(engine.submit(r), Error);
  r.sampling.temperature = INFINITY;
  EXPECT_THROW(engine.submit(r), Error);
  r.sampling.temperature = 0;
  EXPECT_EQ(engine.submit(r).get().tokens.size(), 4u);  // the engine still serves
}

// A random model knows nothing of JSON: constrained, every reply is still a valid instance, ends
// by itself where the grammar does (finish "stop"), and is the same for the same seed.
TEST(Engine, GrammarConstrainedRepliesOfARandomModelAreValidJson) {
  EngineFixture f;
  Engine engine(f.model, f.tokenizer, EngineFixture::exact(2, 512, 16));
  const json schema = json::parse(R"({"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]},
      "level": {"type": "integer"}, "note": {"type": "string", "maxLength": 4}}, "required": ["mood", "level"]})");
  const auto grammar = json_schema_grammar(schema, "schema");
  std::vector<std::future<GenerationOutput>> replies;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    GenerationRequest r = f.request("Answer in JSON:", 200);
    r.sampling.temperature = 1;
    r.sampling.seed = seed;
    r.stop_at_end_tokens = true;
    r.grammar = grammar;
    replies.push_back(engine.submit(r));
  }
  for (auto& reply : replies) {
    const GenerationOutput out = reply.get();
    EXPECT_EQ(out.finish_reason, FinishReason::Stop) << out.text;
    json parsed;
    ASSERT_NO_THROW(parsed = json::parse(out.text)) << out.text;
    EXPECT_TRUE(parsed["mood"] == "happy" || parsed["mood"] == "sad") << out.text;
    EXPECT_TRUE(parsed["level"].is_number_integer()) << out.text;
    for (const auto& [key, v] : parsed.items()) EXPECT_TRUE(key == "mood" || key == "level" || key == "note") << out.text;
  }
  // A forced tool call: after the request's start, arguments and the closing token complete a call.
  const json parameters = json::parse(R"({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
      "required": ["city"]})");
  GenerationRequest call = f.request("<tool_call>\n", 100);
  call.sampling.temperature = 1;
  call.stop_at_end_tokens = true;
  call.grammar = tool_call_grammar({{"get_weather", parameters}, {"get_time", json()}}, ToolCallFrom::Object,
                                   f.tokenizer.special_id("</tool_call>"));
  const GenerationOutput out = engine.submit(call).get();
  const ChatTemplate chat(f.tokenizer);
  ChatOptions offered;
  offered.tools = {"{}"};
  const AssistantReply reply = chat.parse_reply("<tool_call>\n" + out.text, offered);
  ASSERT_EQ(reply.tool_calls.size(), 1u) << out.text;
  EXPECT_TRUE(reply.tool_calls[0].name == "get_weather" || reply.tool_calls[0].name == "get_time") << out.text;
  EXPECT_TRUE(json::parse(reply.tool_calls[0].arguments).is_object()) << out.text;

  // Armed by a token: free text until the model writes <tool_call> (a bias makes this one do so at
  // once), a well-formed call after it; a reply that never writes it is untouched.
  const int32_t open = f.tokenizer.special_id("<tool_call>");
  GenerationRequest lazy = f.request("Hello", 100);
  lazy.sampling.temperature = 1;
  lazy.stop_at_end_tokens = true;
  lazy.grammar = tool_call_grammar({{"get_weather", parameters}}, ToolCallFrom::Marker, f.tokenizer.special_id("</tool_call>"));
  lazy.grammar_after = open;
  lazy.sampling.logit_bias = {{open, 100.0f}};
  const GenerationOutput called = engine.submit(lazy).get();
  ASSERT_EQ(called.tokens[0], open);
  const AssistantReply lazy_reply = chat.parse_reply(called.text, offered);
  ASSERT_EQ(lazy_reply.tool_calls.size(), 1u) << called.text;
  EXPECT_EQ(lazy_reply.tool_calls[0].name, "get_weather");
  lazy.sampling.logit_bias = {{open, -100.0f}};
  lazy.max_tokens = 12;
  GenerationRequest free = lazy;
  free.grammar = nullptr;
  free.grammar_after.reset();
  EXPECT_EQ(engine.submit(lazy).get().tokens, engine.submit(free).get().tokens);
}

// A schema whose alternatives overlap multiplies the parses with every level; past the matcher's
// limit that request fails with the reason, and the others in flight go on.
TEST(Engine, AGrammarPastItsLimitsFailsOnlyItsRequest) {
  EngineFixture f;
  Engine engine(f.model, f.tokenizer, EngineFixture::exact(2, 512, 16));
  json alternatives = json::array();
  for (int i = 0; i < 8; ++i) alternatives.push_back({{"type", "array"}, {"items", {{"$ref", "#/$defs/a"}}}});
  const json schema = {{"$defs", {{"a", {{"anyOf", alternatives}}}}}, {"$ref", "#/$defs/a"}};
  GenerationRequest deep = f.request("x", 50);
  deep.grammar = json_schema_grammar(schema, "schema");
  deep.sampling.logit_bias = {{f.tokenizer.encode("[")[0], 100.0f}};  // "[[[[…": 8× the parses each time
  std::future<GenerationOutput> failing = engine.submit(deep), fine = engine.submit(f.request("The quick brown fox", 8));
  try {
    failing.get();
    ADD_FAILURE() << "the request did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("constrained sampling stopped: grammar: more than 4096 parses"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fine.get().tokens.size(), 8u);
  EXPECT_EQ(engine.submit(f.request("The quick brown fox", 4)).get().tokens.size(), 4u);  // the engine still serves
}

// The scheduler driven on the caller's thread, as an RL rollout loop or an evaluator does: the
// same tokens as the threaded engine; after a weights change its cached prompt states are dropped.
TEST(Scheduler, SteppedDirectlyMatchesTheEngineAndForgetsStaleStatesWhenWeightsChange) {
  EngineFixture f;
  const EngineOptions o = EngineFixture::exact(2, 512, 16);
  const std::string shared = test::sample_text(4, 9);
  const GenerationRequest a = f.request(shared + " first question", 8), b = f.request(shared + " second one", 8);
  std::vector<int32_t> engine_a;
  {
    Engine engine(f.model, f.tokenizer, o);
    engine_a = engine.submit(a).get().tokens;
  }
  Scheduler scheduler(f.model, f.tokenizer, o);
  const auto run = [&](const GenerationRequest& r) {
    const Scheduler::RequestId id = scheduler.add(r);
    for (;;)
      for (Scheduler::Finished& done : scheduler.step())
        if (done.id == id) return std::move(done.output);
  };
  EXPECT_EQ(run(a).tokens, engine_a);
  EXPECT_TRUE(scheduler.idle());
  // New weights: without weights_changed() b would start from a's cached prefix, computed by the old ones.
  test::randomize_params(f.model.params(), 99);
  scheduler.weights_changed();
  const GenerationOutput after = run(b);
  EXPECT_EQ(after.cached_prompt_tokens, 0);
  Scheduler fresh(f.model, f.tokenizer, o);
  const Scheduler::RequestId id = fresh.add(b);
  std::vector<Scheduler::Finished> done;
  while (done.empty()) done = fresh.step();
  ASSERT_EQ(done.front().id, id);
  EXPECT_EQ(after.tokens, done.front().output.tokens);
}

TEST(Engine, StopStringsMaxTokensCancelAndLogprobs) {
  EngineFixture f;
  EngineOptions o;
  o.context = 256;
  o.precision = Precision::F32;
  Engine engine(f.model, f.tokenizer, o);
  GenerationRequest r = f.request("The quick brown fox", 20);
  const GenerationOutput plain = engine.submit(r).get();
  ASSERT_GE(plain.text.size(), 4u);
  r.stop = {plain.text.substr(2, 2)};
  const GenerationOutput stopped = engine.submit(r).get();
  EXPECT_EQ(stopped.finish_reason, FinishReason::Stop);
  EXPECT_EQ(stopped.text, plain.text.substr(0, plain.text.find(r.stop[0])));

  GenerationRequest c = f.request("The quick brown fox", 20);
  int pieces = 0;
  c.on_text = [&](std::string_view) { return ++pieces < 3; };
  const GenerationOutput cancelled = engine.submit(c).get();
  EXPECT_EQ(cancelled.finish_reason, FinishReason::Cancelled);
  EXPECT_LT(cancelled.tokens.size(), 20u);

  GenerationRequest s = f.request("The quick brown fox jumps", 0);  // scoring only
  s.prompt_logprobs = true;
  const GenerationOutput scored = engine.submit(s).get();
  EXPECT_TRUE(scored.tokens.empty());
  ASSERT_EQ(scored.prompt_logprobs.size(), s.prompt.size());
  EXPECT_TRUE(std::isnan(scored.prompt_logprobs[0]));
  for (size_t i = 1; i < s.prompt.size(); ++i) EXPECT_LE(scored.prompt_logprobs[i], 0.0);

  GenerationRequest too_long = f.request("The quick brown fox", 10000);
  EXPECT_THROW(engine.submit(too_long), Error);
}

// What generate and chat print to a terminal: a model cannot send escape sequences to it.
TEST(TextStream, ControlBytesBecomeVisibleForTerminals) {
  EXPECT_EQ(visible_controls("a\x1b[2Jb\n\tc\x07\x7f\x18"), "a\u241b[2Jb\n\tc\u2407\u2421\u2418");
  EXPECT_EQ(visible_controls("caf\xc3\xa9 \xe4\xb8\xad"), "caf\xc3\xa9 \xe4\xb8\xad");
}

TEST(TextStream, HoldsBackIncompleteUtf8AndStopPrefixes) {
  TextStream s({"STOP"});
  EXPECT_EQ(s.push("ab"), "ab");
  EXPECT_EQ(s.push("\xc3"), "");       // half of "é"
  EXPECT_EQ(s.push("\xa9 S"), "\xc3\xa9 ");  // "S" could start "STOP"
  EXPECT_EQ(s.push("T"), "");
  EXPECT_EQ(s.push("x"), "STx");
  EXPECT_EQ(s.push("yST"), "y");
  EXPECT_EQ(s.push("OP and more"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "ab\xc3\xa9 STxy");
}

}  // namespace
}  // namespace hyla

namespace hyla {
namespace {

TEST(Sampler, GreedyTopKOneAndSeedsAreDeterministic) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f};
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(Sampler(greedy).sample(logits.data(), 5), 1);
  SamplingParams top1;
  top1.top_k = 1;
  EXPECT_EQ(Sampler(top1).sample(logits.data(), 5), 1);
  SamplingParams seeded;
  seeded.seed = 42;
  Sampler a(seeded), b(seeded);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits.data(), 5), b.sample(logits.data(), 5));
}

// Frequencies over many draws follow the filtered, renormalised softmax at the temperature.
TEST(Sampler, DrawsFollowTheFilteredDistribution) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, -3.0f};
  const auto frequencies = [&](SamplingParams p) {
    Sampler s(p);
    std::vector<double> f(logits.size(), 0.0);
    const int draws = 200000;
    for (int i = 0; i < draws; ++i) f[size_t(s.sample(logits.data(), int64_t(logits.size())))] += 1.0 / draws;
    return f;
  };
  const auto softmax = [&](double t, const std::vector<int>& keep) {
    std::vector<double> p(logits.size(), 0.0);
    double sum = 0;
    for (int i : keep) sum += p[size_t(i)] = std::exp(logits[size_t(i)] / t);
    for (double& x : p) x /= sum;
    return p;
  };
  const auto expect_close = [](const std::vector<double>& got, const std::vector<double>& want, const char* what) {
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 0.005) << what << " token " << i;
  };
  SamplingParams plain;
  plain.temperature = 0.7;
  plain.seed = 1;
  expect_close(frequencies(plain), softmax(0.7, {0, 1, 2, 3, 4, 5}), "temperature 0.7");
  SamplingParams top_k = plain;
  top_k.top_k = 3;  // tokens 2, 0, 4
  expect_close(frequencies(top_k), softmax(0.7, {2, 0, 4}), "top-k 3");
  SamplingParams top_p;
  top_p.temperature = 1;
  top_p.top_p = 0.8;  // softmax: 2 → 0.57, 0 → 0.21 (0.78), 4 → 0.13 (0.91): keeps 2, 0, 4
  top_p.seed = 2;
  expect_close(frequencies(top_p), softmax(1, {2, 0, 4}), "top-p 0.8");
  SamplingParams min_p;
  min_p.temperature = 1;
  min_p.min_p = 0.3;  // keeps p ≥ 0.3·p(2): logits ≥ 2 + log 0.3 = 0.80 → tokens 2, 0
  min_p.seed = 3;
  expect_close(frequencies(min_p), softmax(1, {2, 0}), "min-p 0.3");
}

// OpenAI's definitions, greedily: logit + bias − frequency_penalty·count − presence_penalty·[count > 0].
TEST(Sampler, LogitBiasAndPenaltiesFollowOpenAisDefinitions) {
  const std::vector<float> logits = {2.0f, 1.75f, 1.5f, 0.0f, -1.0f};  // dyadic: exact in float and double
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.25;
  p.presence_penalty = 0.0625;
  p.logit_bias = {{4, 3.5f}, {0, -0.125f}};
  Sampler sampler(p);
  std::vector<int> count(logits.size(), 0);
  for (int step = 0; step < 40; ++step) {
    int want = 0;
    double best = -1e300;
    for (size_t i = 0; i < logits.size(); ++i) {
      double z = logits[i] - p.frequency_penalty * count[i] - (count[i] > 0 ? p.presence_penalty : 0);
      for (const auto& [token, bias] : p.logit_bias)
        if (size_t(token) == i) z += bias;
      if (z > best) best = z, want = int(i);  // ties: the lower id, as the sampler
    }
    ASSERT_EQ(sampler.sample(logits.data(), int64_t(logits.size())), want) << "step " << step;
    ++count[size_t(want)];
  }
  EXPECT_GT(count[4], 0);  // the bias lifted a token the model ranks last
  EXPECT_GT(count[3], 0);  // and the penalties reached down to one it ranks low
  SamplingParams bad;
  bad.presence_penalty = 2.5;
  EXPECT_THROW(check_sampling(bad), Error);
  bad.presence_penalty = 0;
  bad.logit_bias = {{1, 101.0f}};
  EXPECT_THROW(check_sampling(bad), Error);
}

// A mask (a grammar's) renormalises over the allowed tokens, after the filters.
TEST(Sampler, MaskedDrawsFollowTheAllowedDistribution) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  const std::vector<uint8_t> allowed = {1, 1, 0, 0, 1};
  SamplingParams p;
  p.seed = 4;
  Sampler s(p);
  std::vector<double> f(logits.size(), 0.0);
  const int draws = 200000;
  for (int i = 0; i < draws; ++i) f[size_t(s.sample(logits.data(), int64_t(logits.size()), allowed.data()))] += 1.0 / draws;
  const double z = std::exp(1.0) + std::exp(0.0) + std::exp(0.5);
  EXPECT_NEAR(f[0], std::exp(1.0) / z, 0.005);
  EXPECT_NEAR(f[1], 1.0 / z, 0.005);
  EXPECT_NEAR(f[4], std::exp(0.5) / z, 0.005);
  EXPECT_EQ(f[2] + f[3], 0.0);
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(Sampler(greedy).sample(logits.data(), 5, allowed.data()), 0);
}

TEST(Sampler, LogProbabilityAndTopAlternatives) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  double z = 0;
  for (float x : logits) z += std::exp(double(x));
  std::vector<TokenLogprob> best;
  EXPECT_NEAR(log_probability(logits.data(), 4, 2, 3, &best), 2.0 - std::log(z), 1e-12);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_EQ(best[0].token, 1);  // ties: lower id first
  EXPECT_EQ(best[1].token, 3);
  EXPECT_EQ(best[2].token, 2);
  EXPECT_NEAR(best[0].logprob, 3.0 - std::log(z), 1e-12);
}

}  // namespace
}  // namespace hyla
