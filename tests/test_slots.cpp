// Slots (issue 67): a free slot keeps its last request's state and a request extending it goes on
// from there; a slot's state saved to a file and restored, on this engine or a new one, continues a
// Kimi K3 conversation with the logits it would have had unsaved; and a file that does not belong
// (truncated, corrupt, foreign, too long, another cache dtype) is refused with the slot untouched.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <future>

#include "hyla/data/chat_template.h"
#include "hyla/infer/engine.h"
#include "hyla/infer/slot_file.h"
#include "hyla/io/file.h"
#include "model_test_util.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

struct KimiFixture {
  Tokenizer tokenizer = test::kimi_tokenizer(true);
  std::unique_ptr<Model> model;
  const ModelConfig& config;
  explicit KimiFixture(unsigned seed = 7)
      : model(test::random_kimi_tiny(true, tokenizer.vocab_size(), seed)), config(model->config()) {}
  static EngineOptions options(int64_t prefix_cache_bytes, int64_t context = 2048, DType latent = DType::F32) {
    EngineOptions o;
    o.max_sequences = 2;
    o.context = context;
    o.prefill_chunk = 32;
    o.precision = Precision::F32;
    o.latent_dtype = latent;
    o.prefix_cache_bytes = prefix_cache_bytes;
    o.snapshot_interval = 16;
    return o;
  }
  GenerationRequest request(const std::vector<ChatMessage>& messages) const {
    GenerationRequest r;
    r.prompt = ChatTemplate(tokenizer).encode(messages, /*add_generation_prompt=*/true);
    r.max_tokens = 6;
    r.sampling.temperature = 0;
    r.stop_at_end_tokens = false;
    r.logprobs = true;
    r.top_logprobs = 8;
    return r;
  }
};

std::vector<ChatMessage> first_turn() { return {{"system", "You are terse."}, {"user", test::sample_text(1, 3)}}; }

// The second turn after `reply`: the first turn's prompt, its reply, and a new question.
GenerationRequest second_turn(const KimiFixture& f, const GenerationRequest& first, const GenerationOutput& reply) {
  GenerationRequest r = first;
  r.prompt.insert(r.prompt.end(), reply.tokens.begin(), reply.tokens.end());
  const std::vector<int32_t> more = f.tokenizer.encode(" and then? " + test::sample_text(2, 1));
  r.prompt.insert(r.prompt.end(), more.begin(), more.end());
  return r;
}

Scheduler::SlotTransfer on_worker(Engine& engine, int slot, bool save, const std::filesystem::path& file) {
  return engine
      .between_steps(std::function<Scheduler::SlotTransfer(Scheduler&)>([&](Scheduler& s) {
        return save ? s.save_slot(slot, file) : s.restore_slot(slot, file);
      }), slot)
      .get();
}

void expect_same_logits(const GenerationOutput& a, const GenerationOutput& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.token_logprobs.size(), b.token_logprobs.size()) << what;
  for (size_t i = 0; i < a.token_logprobs.size(); ++i) {
    EXPECT_EQ(a.token_logprobs[i], b.token_logprobs[i]) << what << " token " << i;
    ASSERT_EQ(a.top_logprobs[i].size(), b.top_logprobs[i].size());
    for (size_t k = 0; k < a.top_logprobs[i].size(); ++k) {
      EXPECT_EQ(a.top_logprobs[i][k].token, b.top_logprobs[i][k].token) << what;
      EXPECT_EQ(a.top_logprobs[i][k].logprob, b.top_logprobs[i][k].logprob) << what;
    }
  }
}

TEST(Slots, ASavedK3ConversationContinuesOnANewEngineWithTheLogitsItWouldHaveHad) {
  KimiFixture f;
  test::TempDir dir;
  const GenerationRequest one = f.request(first_turn());
  GenerationOutput reply, unsaved;
  Scheduler::SlotTransfer saved;
  {
    Engine engine(*f.model, f.tokenizer, KimiFixture::options(int64_t(64) << 20));
    reply = engine.submit(one).get();
    saved = on_worker(engine, 0, true, dir / "conversation.slot");
    unsaved = engine.submit(second_turn(f, one, reply)).get();  // the same engine, never saved
  }
  // The state holds the prompt and the reply but its last token, which the next turn feeds.
  EXPECT_EQ(saved.tokens, int64_t(one.prompt.size() + reply.tokens.size()) - 1);
  EXPECT_EQ(saved.bytes, int64_t(std::filesystem::file_size(dir / "conversation.slot")));
  EXPECT_EQ(unsaved.cached_prompt_tokens, saved.tokens);

  // A new engine (its prefill chunks ending where the first engine's did): the restored slot is
  // what it reuses, and it continues bit for bit as the unsaved one.
  const GenerationRequest two = second_turn(f, one, reply);
  Engine restored(*f.model, f.tokenizer, KimiFixture::options(int64_t(64) << 20));
  const Scheduler::SlotTransfer back = on_worker(restored, 1, false, dir / "conversation.slot");
  EXPECT_EQ(back.tokens, saved.tokens);
  EXPECT_EQ(back.bytes, saved.bytes);
  const GenerationOutput continued = restored.submit(two).get();
  EXPECT_EQ(continued.cached_prompt_tokens, saved.tokens);
  expect_same_logits(continued, unsaved, "restored against never saved");
  const auto slots = restored.between_steps(std::function<std::vector<Scheduler::SlotInfo>(Scheduler&)>(&Scheduler::slots)).get();
  EXPECT_EQ(slots[1].tokens, int64_t(two.prompt.size() + continued.tokens.size()) - 1);  // the restored slot went on
  EXPECT_EQ(slots[0].tokens, 0);

  // With prompt-state reuse off, a restored slot is still reused: the operator asked for it.
  Engine no_cache(*f.model, f.tokenizer, KimiFixture::options(0));
  on_worker(no_cache, 0, false, dir / "conversation.slot");
  const GenerationOutput without = no_cache.submit(two).get();
  EXPECT_EQ(without.cached_prompt_tokens, saved.tokens);
  EXPECT_EQ(without.tokens, continued.tokens);

  // And a cold engine reading the whole second prompt agrees (within f32 chunking noise).
  Engine cold(*f.model, f.tokenizer, KimiFixture::options(0));
  const GenerationOutput fresh = cold.submit(two).get();
  EXPECT_EQ(fresh.cached_prompt_tokens, 0);
  EXPECT_EQ(fresh.tokens, continued.tokens);
  for (size_t i = 0; i < fresh.token_logprobs.size(); ++i)
    EXPECT_NEAR(fresh.token_logprobs[i], continued.token_logprobs[i], 1e-4) << "token " << i;
}

// A free slot's own state serves the next turn (prefix cache on), but never a prompt that does not
// extend it, and never when reuse is off and the slot was not restored.
TEST(Slots, AFreeSlotsStateIsReusedOnlyForPromptsThatExtendIt) {
  KimiFixture f;
  const GenerationRequest one = f.request(first_turn());
  for (const int64_t cache : {int64_t(0), int64_t(64) << 20}) {
    Engine engine(*f.model, f.tokenizer, KimiFixture::options(cache));
    const GenerationOutput reply = engine.submit(one).get();
    GenerationRequest edited = second_turn(f, one, reply);
    edited.prompt[3] = edited.prompt[3] == 5 ? 6 : 5;  // an edit early in the history
    EXPECT_EQ(engine.submit(edited).get().cached_prompt_tokens, 0) << cache;
    const GenerationOutput two = engine.submit(second_turn(f, one, reply)).get();
    // With the cache on, the first turn's end was snapshotted too; with it off nothing is reused.
    EXPECT_EQ(two.cached_prompt_tokens, cache ? int64_t(one.prompt.size() + reply.tokens.size()) - 1 : 0) << cache;
  }
}

TEST(Slots, ABadSlotFileIsRefusedAndTheSlotKeepsItsState) {
  KimiFixture f;
  test::TempDir dir;
  Engine engine(*f.model, f.tokenizer, KimiFixture::options(0));
  const GenerationRequest one = f.request(first_turn());
  const GenerationOutput reply = engine.submit(one).get();
  const Scheduler::SlotTransfer saved = on_worker(engine, 0, true, dir / "good");
  const std::string good = read_file(dir / "good");
  const auto variant = [&](const std::string& name, std::string bytes) {
    test::write_bytes(dir / name, bytes);
    return dir / name;
  };
  std::string flipped = good;
  flipped[good.size() / 2] = char(flipped[good.size() / 2] ^ 0x40);
  std::string bad_token = good;
  const int32_t too_big = int32_t(f.config.vocab_size);
  std::memcpy(bad_token.data() + 64, &too_big, sizeof(too_big));
  const auto restore = [&](const std::filesystem::path& file) {
    return engine.between_steps(std::function<int64_t(Scheduler&)>([&](Scheduler& s) {
                       return s.restore_slot(0, file).tokens;
                     }), 0).get();
  };
  test::expect_error([&] { restore(dir / "missing"); }, "slot file missing: no such file");
  test::expect_error([&] { restore(variant("short", good.substr(0, 40))); }, "not a hyla slot file (40 bytes");
  test::expect_error([&] { restore(variant("text", std::string(100, 'x'))); }, "not a hyla slot file (no HYLASLOT");
  test::expect_error([&] { restore(variant("truncated", good.substr(0, good.size() - 100))); },
                     fmt::format("slot file truncated: truncated ({} bytes, its header says {})", good.size() - 100, good.size()));
  test::expect_error([&] { restore(variant("long", good + "tail")); }, "slot file long: 4 bytes past its end");
  test::expect_error([&] { restore(variant("flipped", flipped)); }, "corrupt (its checksum does not match)");
  // A checksum made to match does not let an id outside the vocabulary through.
  {
    uint32_t crc = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(bad_token.data() + 64), uInt(bad_token.size() - 64)));
    std::memcpy(bad_token.data() + 56, &crc, sizeof(crc));
    test::expect_error([&] { restore(variant("token", bad_token)); },
                       fmt::format("token 0 is id {}, outside the vocabulary of {}", too_big, too_big));
  }
  // Another model (other weights, same shapes), another cache dtype, a context too small.
  {
    KimiFixture other(8);
    Engine foreign(*other.model, other.tokenizer, KimiFixture::options(0));
    test::expect_error([&] { on_worker(foreign, 0, false, dir / "good"); }, "slot file good: saved from another model");
    Engine bf16(*f.model, f.tokenizer, KimiFixture::options(0, 2048, DType::BF16));
    test::expect_error([&] { on_worker(bf16, 0, false, dir / "good"); },
                       "its latent cache is f32, this server's is bf16");
    Engine small(*f.model, f.tokenizer, KimiFixture::options(0, saved.tokens - 1));
    test::expect_error([&] { on_worker(small, 0, false, dir / "good"); },
                       fmt::format("holds {} tokens, this server's slots hold {}", saved.tokens, saved.tokens - 1));
  }
  // After all that, the slot still holds the first turn: the second continues from it.
  const auto slots = engine.between_steps(std::function<std::vector<Scheduler::SlotInfo>(Scheduler&)>(&Scheduler::slots)).get();
  EXPECT_EQ(slots[0].tokens, saved.tokens);
  EXPECT_EQ(restore(dir / "good"), saved.tokens);
  test::expect_error([&] { restore(dir / "missing"); }, "no such file");
  EXPECT_EQ(engine.submit(second_turn(f, one, reply)).get().cached_prompt_tokens, saved.tokens);
}

// A slot action on a slot a request runs in waits for it (llama-server defers it), then sees the
// finished request's state; erase empties the slot.
TEST(Slots, AnActionOnABusySlotWaitsForItsRequest) {
  KimiFixture f;
  test::TempDir dir;
  Engine engine(*f.model, f.tokenizer, KimiFixture::options(0));
  GenerationRequest r = f.request(first_turn());
  r.max_tokens = 24;
  // Polled at the start of every step: the second poll comes once the request runs in slot 0.
  std::promise<void> started;
  int polls = 0;
  r.is_cancelled = [&] {
    if (++polls == 2) started.set_value();
    return false;
  };
  r.logprobs = false;
  r.top_logprobs = 0;
  const size_t prompt = r.prompt.size();
  std::future<GenerationOutput> running = engine.submit(std::move(r));
  started.get_future().wait();
  const Scheduler::SlotTransfer saved = on_worker(engine, 0, true, dir / "busy");
  const GenerationOutput out = running.get();
  EXPECT_EQ(saved.tokens, int64_t(prompt + out.tokens.size()) - 1);
  const int64_t erased = engine.between_steps(std::function<int64_t(Scheduler&)>([](Scheduler& s) { return s.erase_slot(0); }), 0).get();
  EXPECT_EQ(erased, saved.tokens);
  test::expect_error([&] {
    engine.between_steps(std::function<int64_t(Scheduler&)>([](Scheduler& s) { return s.erase_slot(2); }), 2).get();
  }, "no slot 2: this server has slots 0 to 1");
}

}  // namespace
}  // namespace hyla
