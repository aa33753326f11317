// RULER's retrieval tasks: a pass key in repeated noise, and needles "One of the special magic
// numbers for KEY is: VALUE." in noise, in the essay haystack, or in a haystack of such needles.
#include <fmt/format.h>

#include "hyla/eval/longctx_task_parts.h"

namespace hyla {
namespace {

std::string random_uuid(Rng& rng) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (int group : {8, 4, 4, 4, 12}) {
    if (!s.empty()) s += '-';
    for (int i = 0; i < group; ++i) s += kHex[rng.below(16)];
  }
  return s;
}

// `noun`: "number" or "uuid".
std::string plural(const char* noun) { return std::string(noun) + "s"; }

std::string needle(bool paraphrased, const std::string& key, const std::string& value, const char* noun) {
  return paraphrased ? fmt::format("A hidden {} that goes with {} is {}.", noun, key, value)
                     : fmt::format("One of the special magic {} for {} is: {}.", plural(noun), key, value);
}

std::string needles_instruction(bool paraphrased, const char* noun) {
  const std::string what = plural(noun);
  return paraphrased ? fmt::format("Several hidden {} are scattered through the text below. Remember each of them; "
                                   "you will be asked about the {} later.\n",
                                   what, what)
                     : fmt::format("Some special magic {} are hidden within the following text. Make sure to memorize "
                                   "it. I will quiz you about the {} afterwards.\n",
                                   what, what);
}

// RULER's preamble where one needle is hidden.
std::string needle_instruction(bool paraphrased, const char* noun) {
  return paraphrased ? fmt::format("One hidden {} is placed in the text below. Remember it; you will be asked about the "
                                   "{} later.\n",
                                   noun, noun)
                     : fmt::format("A special magic {} is hidden within the following text. Make sure to memorize it. I "
                                   "will quiz you about the {} afterwards.\n",
                                   noun, noun);
}

std::string one_value_question(bool paraphrased, const char* noun, const std::string& key) {
  return paraphrased ? fmt::format("\nWhich hidden {} goes with {} in the text above? The hidden {} that goes with {} is",
                                   noun, key, noun, key)
                     : fmt::format("\nWhat is the special magic {} for {} mentioned in the provided text? The special "
                                   "magic {} for {} mentioned in the provided text is",
                                   noun, key, noun, key);
}

// Needles that each carry a new 7-digit number for keys[k % keys.size()], all expected.
Needles numbers_for(const SampleRequest& request, const std::vector<std::string>& keys, int count) {
  Needles n;
  for (int v = 0; v < count; ++v) {
    n.expected.push_back(random_digits(request.rng, 7));
    n.planted.push_back(needle(request.paraphrased, keys[size_t(v) % keys.size()], n.expected.back(), "number"));
  }
  n.prefix = needles_instruction(request.paraphrased, "number");
  return n;
}

std::string all_numbers_question(bool paraphrased, const std::string& keys) {
  return paraphrased ? fmt::format("\nWhich hidden numbers go with {} in the text above? The hidden numbers that go "
                                   "with {} are",
                                   keys, keys)
                     : fmt::format("\nWhat are all the special magic numbers for {} mentioned in the provided text? The "
                                   "special magic numbers for {} mentioned in the provided text are",
                                   keys, keys);
}

}  // namespace

LongCtxSample passkey_sample(const SampleRequest& request) {
  const std::string key = random_digits(request.rng, 5);
  const bool p = request.paraphrased;
  Needles n;
  n.prefix = p ? "A single important fact is buried in the long text below. Locate it and keep it in mind, because you "
                 "will be asked about it.\n"
               : "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will "
                 "quiz you about the important information there.\n";
  n.planted = {p ? fmt::format("The secret code is {}. Keep it in mind. {} is the secret code.", key, key)
                 : fmt::format("The pass key is {}. Remember it. {} is the pass key.", key, key)};
  n.placement = Placement::AtDepth;
  n.suffix = p ? "\nWhat is the secret code? The secret code is" : "\nWhat is the pass key? The pass key is";
  n.expected = {key};
  return haystack_sample(request, Filler::Noise, n);
}

LongCtxSample single_needle_sample(const SampleRequest& request, Filler filler, NeedleValue value, size_t keys) {
  const bool uuid = value == NeedleValue::Uuid;
  const char* noun = uuid ? "uuid" : "number";
  const std::vector<std::string> drawn = distinct(request.rng, request.haystack.words(), keys);
  Needles n;
  for (const std::string& key : drawn) {
    const std::string v = uuid ? random_uuid(request.rng) : random_digits(request.rng, 7);
    if (n.expected.empty()) n.expected = {v};
    n.planted.push_back(needle(request.paraphrased, key, v, noun));
  }
  n.placement = Placement::AtDepth;
  n.prefix = keys == 1 ? needle_instruction(request.paraphrased, noun) : needles_instruction(request.paraphrased, noun);
  n.suffix = one_value_question(request.paraphrased, noun, drawn[0]);
  return haystack_sample(request, filler, n);
}

LongCtxSample needle_haystack_sample(const SampleRequest& request, NeedleValue value) {
  Rng& rng = request.rng;
  const bool uuid = value == NeedleValue::Uuid, p = request.paraphrased;
  const char* noun = uuid ? "uuid" : "number";
  const std::vector<std::string>& words = request.haystack.words();
  auto new_value = [&] { return uuid ? random_uuid(rng) : random_digits(rng, 7); };
  const std::string key = uuid ? random_uuid(rng) : words[rng.below(words.size())];
  Needles n;
  n.expected = {new_value()};
  n.planted = {needle(p, key, n.expected[0], noun)};
  n.placement = Placement::AtDepth;
  n.prefix = needles_instruction(p, noun);
  n.suffix = one_value_question(p, noun, key);
  n.filler_sentence = [&, key, noun, p] {
    std::string other;
    do other = uuid ? random_uuid(rng) : words[rng.below(words.size())];
    while (other == key);
    return needle(p, other, new_value(), noun);
  };
  return haystack_sample(request, Filler::Generated, n);
}

LongCtxSample multivalue_sample(const SampleRequest& request) {
  const std::vector<std::string> key = distinct(request.rng, request.haystack.words(), 1);
  Needles n = numbers_for(request, key, 4);
  n.suffix = all_numbers_question(request.paraphrased, key[0]);
  return haystack_sample(request, Filler::Essay, n);
}

LongCtxSample multiquery_sample(const SampleRequest& request) {
  const std::vector<std::string> keys = distinct(request.rng, request.haystack.words(), 4);
  Needles n = numbers_for(request, keys, 4);
  n.suffix = all_numbers_question(request.paraphrased, fmt::format("{}, {}, {}, and {}", keys[0], keys[1], keys[2], keys[3]));
  return haystack_sample(request, Filler::Essay, n);
}

}  // namespace hyla
