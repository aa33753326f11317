#include "hyla/infer/generator.h"

#include <chrono>

#include "hyla/core/error.h"

namespace hyla {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
size_t complete_utf8(std::string_view s) {
  size_t i = s.size(), back = 0;
  while (i > 0 && back < 4) {
    const auto c = uint8_t(s[i - 1]);
    if ((c & 0xc0) != 0x80) {  // a lead byte (or ASCII): is its sequence complete?
      const size_t need = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i, ++back;
  }
  return s.size();  // only continuation bytes: invalid UTF-8, pass it through
}

}  // namespace

std::string TextStream::push(std::string_view bytes) {
  pending_.append(bytes);
  const size_t n = complete_utf8(pending_);
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  return out;
}

std::string TextStream::flush() { return std::exchange(pending_, {}); }

Tensor prefill(Model& model, const std::vector<int32_t>& ids, SequenceState& state, int64_t chunk, Precision p) {
  HYLA_CHECK(!ids.empty(), "prefill: no tokens");
  HYLA_CHECK(state.length() + int64_t(ids.size()) <= state.capacity(), "prefill: {} tokens exceed the context of {}",
             state.length() + int64_t(ids.size()), state.capacity());
  Tensor logits;
  for (size_t at = 0; at < ids.size(); at += size_t(chunk)) {
    const size_t n = std::min(ids.size() - at, size_t(chunk));
    ModelInput in;
    in.ids.assign(ids.begin() + int64_t(at), ids.begin() + int64_t(at + n));
    in.tokens = TokenBatch::packed({int64_t(n)}, {state.length()});
    logits = model.forward_cached(in, std::span<SequenceCache>(&state.cache(), 1), p);
  }
  return logits;
}

GenerationResult generate(Model& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                          const GenerationOptions& options, SequenceState& state,
                          const std::function<bool(std::string_view)>& on_text) {
  HYLA_CHECK(!prompt.empty(), "generate: the prompt is empty");
  HYLA_CHECK(state.length() < int64_t(prompt.size()), "generate: the state already holds the whole prompt");
  GenerationResult result;
  result.prompt_tokens = int64_t(prompt.size());
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> rest(prompt.begin() + state.length(), prompt.end());
  Tensor logits = prefill(model, rest, state, options.prefill_chunk, options.precision);
  result.prefill_seconds = seconds_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(options.sampling);
  TextStream stream;
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> end_ids;
  for (const char* name : {"<|endoftext|>", "<|im_end|>"})
    if (auto id = tokenizer.token_id(name)) end_ids.push_back(*id);
  result.finish_reason = "length";
  size_t emitted = 0;  // bytes of result.text already passed to on_text
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    const int32_t token = sampler.sample(logits.data<float>(), vocab);
    result.tokens.push_back(token);
    if (options.stop_at_end_tokens && std::find(end_ids.begin(), end_ids.end(), token) != end_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    result.text += stream.push(tokenizer.decode_token(token));
    // Stop strings: cut the text before the first one; hold back a possible partial match.
    size_t cut = std::string::npos, hold = 0;
    for (const std::string& s : options.stop) {
      if (s.empty()) continue;
      cut = std::min(cut, result.text.find(s));
      for (size_t k = std::min(s.size() - 1, result.text.size()); k > 0; --k)
        if (result.text.compare(result.text.size() - k, k, s, 0, k) == 0) {
          hold = std::max(hold, k);
          break;
        }
    }
    if (cut != std::string::npos) {
      result.text.resize(cut);
      result.finish_reason = "stop";
    }
    const size_t ready = cut != std::string::npos ? result.text.size() : result.text.size() - std::min(hold, result.text.size());
    if (on_text && ready > emitted) {
      if (!on_text(std::string_view(result.text).substr(emitted, ready - emitted))) {
        result.finish_reason = "cancelled";
        break;
      }
      emitted = ready;
    }
    if (cut != std::string::npos) break;
    if (state.length() >= state.capacity()) break;
    ModelInput in;
    in.ids = {token};
    in.tokens = TokenBatch::packed({1}, {state.length()});
    logits = model.forward_cached(in, std::span<SequenceCache>(&state.cache(), 1), options.precision);
  }
  if (result.finish_reason == "length" || result.finish_reason == "stop") {
    if (result.finish_reason == "length") result.text += stream.flush();
    if (on_text && result.text.size() > emitted) on_text(std::string_view(result.text).substr(emitted));
  }
  result.decode_seconds = seconds_since(t1);
  return result;
}

}  // namespace hyla
