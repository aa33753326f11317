#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/core/threads.h"
#include "hyla/data/bpe_trainer.h"
#include "hyla/data/byte_level.h"
#include "hyla/data/chat_template.h"
#include "hyla/data/pre_tokenizer.h"
#include "hyla/data/regex.h"
#include "hyla/data/tokenizer.h"
#include "hyla/data/tokenizer_json.h"
#include "hyla/data/utf8.h"
#include "hyla/io/file.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using test::expect_error;

using test::small_tokenizer;
using json = nlohmann::json;

std::string random_bytes(Rng& rng, size_t length) {
  std::string s(length, '\0');
  for (char& c : s) c = char(rng.below(256));
  return s;
}

// Catastrophic backtracking hits PCRE2's limits: the error names the pattern, the limit and a fix.
TEST(Regex, ALimitHitNamesThePatternAndTheLimit) {
  const Regex nested("(a|aa)+$", false, "test");
  RegexMatchData scratch;
  const std::string text = std::string(4000, 'a') + "b";
  size_t begin = 0, end = 0;
  try {
    nested.find(text, 0, scratch, begin, end);
    ADD_FAILURE() << "expected a limit error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/(a|aa)+$/"), std::string::npos) << m;
    EXPECT_NE(m.find("limit"), std::string::npos) << m;
    EXPECT_NE(m.find("possessive"), std::string::npos) << m;
  }
}

TEST(ByteLevel, MapsEveryByteToOnePrintableCharacterAndBack) {
  std::string all(256, '\0');
  for (int b = 0; b < 256; ++b) all[size_t(b)] = char(b);
  const std::string mapped = byte_level_encode(all);
  EXPECT_EQ(byte_level_decode(mapped), all);
  EXPECT_EQ(byte_level_char(' '), U'\u0120');  // 'Ġ'
  EXPECT_EQ(byte_level_char('!'), U'!');
  EXPECT_EQ(byte_level_char(0), U'\u0100');
  EXPECT_EQ(byte_level_order()[0], '!');
  EXPECT_EQ(byte_level_order()[188], 0);  // the 188 printable bytes come first
  EXPECT_FALSE(byte_level_decode("\xe6\x9d\xb1").has_value());  // '東' is outside the map
  EXPECT_FALSE(byte_level_decode("\xc0\xa1").has_value());      // overlong '!'
}

TEST(Tokenizer, RoundTripsRandomBytesIncludingInvalidUtf8) {
  const Tokenizer& tok = small_tokenizer();
  Rng rng(42);
  for (int i = 0; i < 300; ++i) {
    const std::string text = random_bytes(rng, rng.below(200));
    for (bool allow_special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(text, allow_special);
      ASSERT_EQ(tok.decode(ids), text) << "case " << i;
    }
  }
  // Ill-formed UTF-8 between letters: truncated sequences, stray continuations, surrogates, 0xFF.
  const std::string nasty = "ab\xe6\x9d" "cd\x80\x80 e\xed\xa0\x80" "f\xff\xfe g\xf0\x9f\x98" "\n\xc3";
  EXPECT_EQ(tok.decode(tok.encode(nasty)), nasty);
}

TEST(Tokenizer, RoundTripsRealTextAndCompressesIt) {
  const Tokenizer& tok = small_tokenizer();
  const std::string text = test::sample_text(40, 7);  // other paragraphs than the training text
  const std::vector<int32_t> ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 2) << "a trained tokenizer should merge common words";
  // decode_token streams: the pieces concatenate to the text.
  std::string streamed;
  for (int32_t id : ids) streamed += tok.decode_token(id);
  EXPECT_EQ(streamed, text);
}

TEST(Tokenizer, SpecialsMatchOnlyWhenAllowed) {
  const Tokenizer& tok = small_tokenizer();
  const int32_t eot = tok.special_id("<|endoftext|>");
  EXPECT_EQ(eot, tok.vocab_size() - 10);
  const std::string text = "one<|endoftext|>two <|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> plain = tok.encode(text, false), special = tok.encode(text, true);
  for (int32_t id : plain) EXPECT_FALSE(tok.is_special(id));
  EXPECT_EQ(std::count(special.begin(), special.end(), eot), 1);
  EXPECT_EQ(std::count(special.begin(), special.end(), tok.special_id("<|im_start|>")), 1);
  EXPECT_EQ(std::count(special.begin(), special.end(), tok.special_id("<|im_end|>")), 1);
  EXPECT_EQ(tok.decode(plain), text);
  EXPECT_EQ(tok.decode(special), text);
  for (std::string_view s : kSpecialTokens) {
    EXPECT_EQ(tok.token_id(s), tok.special_id(s));
    EXPECT_EQ(tok.encode(std::string(s), true), std::vector<int32_t>{tok.special_id(s)});
  }
  expect_error([&] { tok.special_id("<|nope|>"); }, "no special token '<|nope|>'");
  expect_error([&] { tok.decode_token(tok.vocab_size()); }, "not in the vocabulary");
}

TEST(Tokenizer, LongPiecesAndRepeatsEncodeQuickly) {
  const Tokenizer& tok = small_tokenizer();
  const std::string long_word(200000, 'e');  // one pre-token: the heap-based merge keeps this fast
  EXPECT_EQ(tok.decode(tok.encode(long_word)), long_word);
  const std::string digits = "20240917";
  EXPECT_EQ(tok.encode(digits).size(), digits.size()) << "digits are split one by one";
}

TEST(Tokenizer, SaveLoadGivesTheSameIds) {
  test::TempDir dir;
  const Tokenizer& tok = small_tokenizer();
  tok.save(dir / "tokenizer.json");
  const Tokenizer loaded = Tokenizer::load(dir / "tokenizer.json");
  const std::string text = test::sample_text(20, 3) + "<|endoftext|>\xff";
  EXPECT_EQ(loaded.encode(text), tok.encode(text));
  EXPECT_EQ(loaded.encode(text, true), tok.encode(text, true));
  EXPECT_EQ(loaded.vocab_size(), tok.vocab_size());
  EXPECT_EQ(loaded.to_json().dump(), tok.to_json().dump());
  // The HF layout.
  const json j = json::parse(read_file(dir / "tokenizer.json"));
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["vocab"].size() + j["added_tokens"].size(), size_t(tok.vocab_size()));
  EXPECT_EQ(j["pre_tokenizer"]["type"], "Sequence");
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], std::string(kDefaultPattern));
  EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][1]["type"], "ByteLevel");
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_TRUE(j["normalizer"].is_null());
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(j["added_tokens"][0]["special"], true);
  EXPECT_EQ(j["model"]["merges"][0].get<std::string>().find(' ') != std::string::npos, true);
}

TEST(Tokenizer, TwoTokenizersOnOneThreadKeepTheirOwnCaches) {
  const Tokenizer& a = small_tokenizer();
  const std::string text = test::sample_text(5, 9);
  const std::string_view texts[] = {text};
  BpeTrainOptions options;
  options.vocab_size = 300;
  const Tokenizer b(train_bpe(texts, options), "b");
  const std::vector<int32_t> ids_a = a.encode(text), ids_b = b.encode(text);
  EXPECT_NE(ids_a, ids_b);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.encode(text), ids_a);
    EXPECT_EQ(b.encode(text), ids_b);
  }
}

// A GPT-2-style tokenizer.json written by hand: the 256 byte tokens in GPT-2's order (ids 0-255),
// six merges, and <|endoftext|> in both model.vocab and added_tokens.
json gpt2_style_json(bool merges_as_pairs) {
  json vocab = json::object();
  for (int i = 0; i < 256; ++i) vocab[byte_level_encode(std::string(1, char(byte_level_order()[size_t(i)])))] = i;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}};
  json merge_list = json::array();
  int id = 256;
  for (const auto& [l, r] : merges) {
    vocab[l + r] = id++;
    merge_list.push_back(merges_as_pairs ? json::array({l, r}) : json(l + " " + r));
  }
  vocab["<|endoftext|>"] = 262;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {{{"id", 262}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
                             {"rstrip", false}, {"normalized", true}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
                              {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                     {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                     {"byte_fallback", false}, {"vocab", vocab}, {"merges", merge_list}}}};
}

TEST(Tokenizer, LoadsAHandWrittenGpt2StyleFile) {
  for (bool pairs : {false, true}) {
    const Tokenizer tok = Tokenizer::from_json(gpt2_style_json(pairs), "gpt2.json");
    EXPECT_EQ(tok.vocab_size(), 263);
    // "hello" merges fully; " the" becomes "Ġthe".
    EXPECT_EQ(tok.encode("hello the"), (std::vector<int32_t>{261, 258}));
    // "Hello": only "l l" applies. Printable ASCII byte b has id b - 33.
    EXPECT_EQ(tok.encode("Hello"), (std::vector<int32_t>{'H' - 33, 'e' - 33, 259, 'o' - 33}));
    // GPT-2's regex keeps digit runs together; a space is id 220, byte 0 is id 188.
    EXPECT_EQ(tok.encode(std::string("123 \0", 5), true), (std::vector<int32_t>{'1' - 33, '2' - 33, '3' - 33, 220, 188}));
    EXPECT_EQ(tok.encode("a<|endoftext|>", true), (std::vector<int32_t>{'a' - 33, 262}));
    EXPECT_EQ(tok.encode("<|endoftext|>", false).size(), 13u);
    EXPECT_EQ(tok.decode(std::vector<int32_t>{261, 258, 262}), "hello the<|endoftext|>");
  }
}

TEST(Tokenizer, APairListedTwiceKeepsItsLaterRankLikeHf) {
  json j = gpt2_style_json(false);
  j["model"]["vocab"]["ab"] = 263;
  j["model"]["vocab"]["bc"] = 264;
  j["model"]["merges"] = {"a b", "b c", "a b"};
  const Tokenizer tok = Tokenizer::from_json(j, "dup.json");
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{'a' - 33, 264}));  // HF tokenizers gives "a", "bc" too
}

TEST(Tokenizer, LoadsAQwenStyleFile) {
  json j = gpt2_style_json(true);
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", std::string(kDefaultPattern)}}}, {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  j["model"]["vocab"].erase("<|endoftext|>");  // Qwen keeps its specials in added_tokens only
  j["added_tokens"].push_back({{"id", 263}, {"content", "<|im_start|>"}, {"single_word", false}, {"lstrip", false},
                               {"rstrip", false}, {"normalized", false}, {"special", true}});
  j["model"]["ignore_merges"] = false;
  const Tokenizer tok = Tokenizer::from_json(j, "qwen.json");
  EXPECT_EQ(tok.vocab_size(), 264);
  EXPECT_EQ(tok.encode("hello the"), (std::vector<int32_t>{261, 258}));
  EXPECT_EQ(tok.encode("123"), (std::vector<int32_t>{'1' - 33, '2' - 33, '3' - 33}));  // single digits
  EXPECT_EQ(tok.encode("<|im_start|>hello", true), (std::vector<int32_t>{263, 261}));
  EXPECT_TRUE(tok.spec().nfc_normalizer);
  EXPECT_EQ(tok.to_json()["normalizer"]["type"], "NFC");
}

TEST(Tokenizer, RejectsFilesItCannotEncodeFaithfully) {
  auto with = [](auto edit) {
    json j = gpt2_style_json(false);
    edit(j);
    return j;
  };
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["model"]["type"] = "WordPiece"; }), "t.json"); },
               "t.json: model.type 'WordPiece' is not supported");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j.erase("model"); }), "t.json"); }, "model is missing");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["model"]["dropout"] = 0.1; }), "t.json"); },
               "model.dropout = 0.1 is not supported");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["model"]["merges"].push_back("x yz"); }), "t.json"); },
               "'yz', which is not in model.vocab");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["model"]["merges"].push_back("xyz"); }), "t.json"); },
               "must be two tokens separated by one space");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }), "t.json"); },
               "decoder type 'WordPiece' is not supported");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }), "t.json"); },
               "pre_tokenizer type 'Whitespace' is not supported");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }), "t.json"); },
               "normalizer type 'Lowercase' is not supported");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["model"]["vocab"]["he"] = 0; }), "t.json"); },
               "id 0 is used twice");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["model"]["vocab"]["東"] = 300; }), "t.json"); },
               "outside the byte-level alphabet");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["added_tokens"][0]["id"] = 5; }), "t.json"); },
               "reuses id 5");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["added_tokens"][0]["id"] = 2000000000; }), "t.json"); },
               "token id 2000000000 is too large");
  expect_error([&] { Tokenizer::from_json(with([](json& j) { j["surprise"] = 1; }), "t.json"); },
               "unknown key surprise");
  expect_error(
      [&] {
        Tokenizer::from_json(with([](json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "("}}}, {"behavior", "Isolated"}, {"invert", false}}, {{"type", "ByteLevel"}}}}}; }), "t.json");
      },
      "invalid regex");
  // A vocabulary without some byte tokens loads, but cannot encode those bytes.
  const Tokenizer partial = Tokenizer::from_json(with([](json& j) { j["model"]["vocab"].erase("Ā"); }), "t.json");
  EXPECT_EQ(partial.encode("hello").size(), 1u);
  expect_error([&] { partial.encode(std::string(1, '\0')); }, "t.json: cannot encode byte 0x00");

  test::TempDir dir;
  test::write_bytes(dir / "bad.json", "{\"model\": ");
  expect_error([&] { Tokenizer::load(dir / "bad.json"); }, "bad.json");
}

TEST(BpeTrainer, BreaksTiesByTheBytesOfThePair) {
  // Every pair occurs once: the merges go in byte order of (left, right): " c" < "ab" < " cd".
  const std::string text = "ab cd";
  const std::string_view texts[] = {text};
  BpeTrainOptions options;
  options.vocab_size = 256 + 3 + 10;
  const Tokenizer tok(train_bpe(texts, options), "ties");
  const auto& merges = tok.spec().merges;
  ASSERT_EQ(merges.size(), 3u);
  auto bytes = [&](std::pair<int32_t, int32_t> m) {
    return std::string(tok.decode_token(m.first)) + "|" + std::string(tok.decode_token(m.second));
  };
  EXPECT_EQ(bytes(merges[0]), " |c");
  EXPECT_EQ(bytes(merges[1]), " c|d");
  EXPECT_EQ(bytes(merges[2]), "a|b");
  EXPECT_EQ(tok.encode("ab cd"), (std::vector<int32_t>{258, 257}));
}

TEST(BpeTrainer, LearnsTheMostFrequentPairFirstAndSkipsSpecials) {
  const std::string text = "aaab aaab aaab xy<|endoftext|>xy";
  const std::string_view texts[] = {text};
  BpeTrainOptions options;
  options.vocab_size = 256 + 1 + 10;
  const Tokenizer tok(train_bpe(texts, options), "freq");
  ASSERT_EQ(tok.spec().merges.size(), 1u);
  EXPECT_EQ(tok.decode_token(256), "aa");  // 6 occurrences ("aaa" holds two overlapping pairs, 3 words)
  // The specials of the text are not learnt from: "<|" never becomes a token.
  BpeTrainOptions more = options;
  more.vocab_size = 400;
  const Tokenizer big(train_bpe(texts, more), "freq");
  EXPECT_FALSE(big.token_id("<|").has_value());
  EXPECT_FALSE(big.token_id("|>").has_value());
  EXPECT_LT(big.vocab_size(), 400) << "the text runs out of pairs";
}

// The textbook algorithm: recount every pair before each merge; same tie rule.
std::vector<std::string> reference_merges(const std::string& text, int merges) {
  PreTokenizerConfig config;
  config.splits.push_back({std::string(kDefaultPattern), false});
  const PreTokenizer pre(config, "reference");
  RegexMatchData match_data;
  std::map<std::string, int64_t> counts;
  pre.split(text, match_data, [&](std::string_view piece) { ++counts[std::string(piece)]; });
  std::vector<std::pair<std::vector<std::string>, int64_t>> words;
  for (const auto& [piece, n] : counts) {
    std::vector<std::string> symbols;
    for (char c : piece) symbols.emplace_back(1, c);
    words.emplace_back(std::move(symbols), n);
  }
  std::vector<std::string> out;
  for (int m = 0; m < merges; ++m) {
    std::map<std::pair<std::string, std::string>, int64_t> pairs;
    for (const auto& [symbols, n] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += n;
    if (pairs.empty()) break;
    auto best = pairs.begin();  // std::map order = the tie rule: bytes of left, then of right
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    const auto [left, right] = best->first;
    out.push_back(left + "|" + right);
    for (auto& [symbols, n] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) merged.push_back(left + right), ++i;
        else merged.push_back(symbols[i]);
      }
      symbols = std::move(merged);
    }
  }
  return out;
}

TEST(BpeTrainer, MatchesTheTextbookAlgorithm) {
  // Sample prose plus random words over a small alphabet: many pairs, many ties.
  std::string text = test::sample_text(40, 21);
  Rng rng(3);
  const std::string_view letters[] = {"a", "b", "c", "d", "e", "é", "ß", "1", ".", "'"};
  for (int w = 0; w < 4000; ++w) {
    for (uint64_t n = 1 + rng.below(7); n > 0; --n) text += letters[rng.below(10)];
    text += rng.below(10) == 0 ? "\n" : " ";
  }
  const std::string_view texts[] = {text};
  BpeTrainOptions options;
  options.vocab_size = 256 + 300 + 10;
  const TokenizerSpec spec = train_bpe(texts, options);
  const Tokenizer tok(spec, "incremental");
  std::vector<std::string> merges;
  for (const auto& [l, r] : spec.merges)
    merges.push_back(std::string(tok.decode_token(l)) + "|" + std::string(tok.decode_token(r)));
  EXPECT_EQ(merges, reference_merges(text, int(merges.size())));
  EXPECT_EQ(merges.size(), 300u);
}

TEST(BpeTrainer, IsDeterministicWhateverTheThreadCount) {
  // Big enough to be cut into several chunks counted in parallel.
  std::string text;
  for (int i = 0; text.size() < (size_t(3) << 20); ++i) text += test::sample_text(50, uint64_t(i));
  const std::string_view texts[] = {text};
  BpeTrainOptions options;
  options.vocab_size = 400;
  auto train = [&] { return tokenizer_json(train_bpe(texts, options)).dump(); };
  const int threads = num_threads();
  set_threads(1);
  const std::string one = train();
  set_threads(2);
  const std::string two = train();
  const std::string again = train();
  set_threads(threads);
  EXPECT_EQ(one, two);
  EXPECT_EQ(two, again);
}

TEST(BpeTrainer, RejectsBadInput) {
  test::TempDir dir;
  test::write_bytes(dir / "empty.txt", "");
  test::write_bytes(dir / "binary.bin", std::string("text\0more", 9));
  test::write_bytes(dir / "ok.txt", "some text");
  BpeTrainOptions options;
  expect_error([&] { train_bpe_files(std::vector<std::filesystem::path>{dir / "ok.txt", dir / "empty.txt"}, options); },
               "empty.txt: empty file");
  expect_error([&] { train_bpe_files(std::vector<std::filesystem::path>{dir / "binary.bin"}, options); },
               "binary.bin: binary file (NUL byte at offset 4)");
  options.vocab_size = 265;
  expect_error([&] { train_bpe_files(std::vector<std::filesystem::path>{dir / "ok.txt"}, options); },
               "--vocab-size 265 is too small: the 256 byte tokens and 10 special tokens need at least 266");
  options.vocab_size = 100;
  expect_error([&] { train_bpe_files(std::vector<std::filesystem::path>{dir / "ok.txt"}, options); }, "too small");
}

TEST(Utf8, CompletePrefixHoldsBackUnfinishedCharacters) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe6"), 2u);          // first byte of a 3-byte character
  EXPECT_EQ(utf8_complete_prefix("ab\xe6\x9d"), 2u);      // two of three
  EXPECT_EQ(utf8_complete_prefix("ab\xe6\x9d\xb1"), 5u);  // complete
  EXPECT_EQ(utf8_complete_prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(utf8_complete_prefix("a\xff"), 2u);  // never valid: passed through
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
}

TEST(TokenizerCli, TrainEncodeDecodeRoundTrip) {
  test::TempDir dir;
  test::write_bytes(dir / "corpus.txt", test::sample_text(30, 4));
  std::string bytes = test::sample_text(3, 5) + std::string("\xff\x00<|endoftext|>", 15);
  test::write_bytes(dir / "input.bin", bytes);
  const std::string tok = (dir / "tok.json").string();
  auto r = test::run_hyla("--threads 1 tokenizer train --input " + (dir / "corpus.txt").string() +
                          " --vocab-size 300 --out " + tok);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Tokenizer::load(tok).vocab_size(), 300) << r.output;
  r = test::run_hyla("tokenizer encode --tokenizer " + tok + " --input " + (dir / "input.bin").string() + " --out " +
                     (dir / "ids.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json ids = json::parse(read_file(dir / "ids.json"));
  ASSERT_TRUE(ids.is_array());
  r = test::run_hyla("tokenizer decode --tokenizer " + tok + " --input " + (dir / "ids.json").string() + " --out " +
                     (dir / "back.bin").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(dir / "back.bin"), bytes);

  test::write_bytes(dir / "bad_ids.json", "[1, 2, 99999]");
  r = test::run_hyla("tokenizer decode --tokenizer " + tok + " --input " + (dir / "bad_ids.json").string() +
                     " --out " + (dir / "x").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("error: " + (dir / "bad_ids.json").string() + ": element 2 (99999) is not a token id"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "x"));
  r = test::run_hyla("tokenizer train --input " + (dir / "corpus.txt").string() + " --vocab-size 10 --out " + tok);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("is too small"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hyla
