#pragma once
// The long-context suite's tasks: seeded generators of prompts that fill a length in tokens, after
// RULER (Hsieh et al., 2024) and bAbI (Weston et al., 2015), in two tiers: retrieval (find one or a
// few planted facts) and synthesis (combine facts spread over the context: follow a chain of
// assignments, count words, track entities, recall many pairs). Every sample is a pure function of
// (generator version, seed, task, length, depth, index), so a cell can be regenerated alone.
//
// A prompt is the task's instruction, the context, and the question, tokenised piece by piece with
// the model's tokenizer: every haystack piece is " sentence" (one leading space, no trailing
// space), and the last piece is tokenised with the question, so the pieces' ids are the ids of
// the joined text (the tests check it). The prompt and the task's answer budget together fit the
// length.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/data/tokenizer.h"

namespace hyla {

inline constexpr const char* kLongCtxGenerator = "hyla-longctx-2";

enum class LongCtxTier : uint8_t { Retrieval, Synthesis };
const char* to_string(LongCtxTier tier);  // "retrieval", "synthesis"

// The words around a sample's facts: RULER's templates (what training draws), or paraphrases of
// every instruction, planted sentence and question (the held-out form: a score on them is not a
// memorised template). The draws (keys, values, places) are the same in both.
enum class LongCtxWording : uint8_t { Ruler, Paraphrased };
const char* to_string(LongCtxWording wording);  // "ruler", "paraphrased"

struct LongCtxTask {
  std::string name;  // as the user gave it: "passkey", "vt_2x8", ...
  LongCtxTier tier = LongCtxTier::Retrieval;
  bool uses_depth = false;  // one needle placed at a depth; otherwise the facts spread over the context
  int64_t max_tokens = 32;  // the answer's budget, part of the length
};

// The task of that name; an unknown name is an error listing the known ones.
LongCtxTask longctx_task(const std::string& name);
// The default suite, retrieval first.
std::vector<std::string> default_longctx_tasks();
// Every name longctx_task accepts, with what it is (for --help and errors).
std::string describe_longctx_tasks();

// The text haystacks are cut from, pre-tokenised once: each non-empty line is a sentence.
class Haystack {
 public:
  Haystack(std::string_view text, const Tokenizer& tokenizer);
  int64_t sentences() const { return int64_t(offsets_.size()) - 1; }
  // Sentence i's ids (as " sentence"), i taken modulo the count: haystacks longer than the text wrap.
  std::vector<int32_t>::const_iterator begin(int64_t i) const;
  std::vector<int32_t>::const_iterator end(int64_t i) const;
  int64_t tokens(int64_t i) const;
  // The text's distinct lower-case words of 3–10 letters, sorted: the keys and the common words.
  const std::vector<std::string>& words() const { return words_; }
  // The 1024 words (or all, if fewer) that take the fewest tokens after a space, by tokens then
  // alphabetically: MQAR's keys and values. One token each under a tokenizer trained on such text.
  const std::vector<std::string>& short_words() const { return short_words_; }

 private:
  std::vector<int32_t> ids_;
  std::vector<int64_t> offsets_;
  std::vector<std::string> words_, short_words_;
};

struct LongCtxSample {
  std::vector<int32_t> prompt;
  std::vector<std::string> expected;  // each must appear in the answer
  std::vector<std::string> inserted;  // the sentences planted in the context (the contamination check's)
  double depth = -1;                  // where the needle went, as a fraction of the context; −1: spread
};

// A length too short for a task (its instruction, one-shot example and facts alone exceed it).
class LongCtxDoesNotFit : public Error {
 public:
  using Error::Error;
};

// Sample `index` of a cell. `no_context`: the same instruction and question with the context
// left out (the control that must score at chance). Throws LongCtxDoesNotFit when the length
// cannot hold the task.
LongCtxSample make_longctx_sample(const LongCtxTask& task, const Haystack& haystack, const Tokenizer& tokenizer,
                                  int64_t length, double depth, uint64_t seed, uint64_t index, bool no_context = false,
                                  LongCtxWording wording = LongCtxWording::Ruler);

// The answer a model should write after the prompt: the expected strings joined by ", ", after a
// space, ending with a full stop (what training on the tasks teaches).
std::string longctx_answer(const LongCtxSample& sample);

// RULER's scoring: the share of expected strings present in `output`, case ignored.
double share_found(std::string_view output, const std::vector<std::string>& expected);

}  // namespace hyla
