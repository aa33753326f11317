#pragma once
// Text generation for one sequence: chunked prefill of the prompt through the model's cached
// forward, then token-by-token decode with a sampler, streaming text as it completes.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/tokenizer.h"
#include "hyla/infer/sampler.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/model/model.h"

namespace hyla {

struct GenerationOptions {
  int64_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;  // the text ends before the first of these
  bool stop_at_end_tokens = true; // <|endoftext|> and <|im_end|> end the text
  int64_t prefill_chunk = 512;    // prompt tokens per forward
  Precision precision = Precision::BF16;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (a stop string's tokens included)
  std::string text;             // generated text, cut before any stop string
  std::string finish_reason;    // "stop" or "length"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// Continues `state` (which may already hold a prefix of `prompt`: those tokens are skipped) with
// the rest of the prompt, then generates. `on_text` receives each new piece of text as soon as it
// is complete UTF-8; returning false stops generation (e.g. a disconnected client).
GenerationResult generate(Model& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                          const GenerationOptions& options, SequenceState& state,
                          const std::function<bool(std::string_view)>& on_text = {});

// Feeds `ids` to the state in chunks; returns the logits [V] after the last one.
Tensor prefill(Model& model, const std::vector<int32_t>& ids, SequenceState& state, int64_t chunk, Precision p);

// Text pieces from token bytes, holding back incomplete UTF-8 until it completes.
class TextStream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace hyla
