// tiktoken files as hyla tokenizers (data/tiktoken.h): encoding against a plain tiktoken
// reference, round trips, Kimi's pre-split pattern, a Kimi checkpoint's specials, bad files.
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

#include "hyla/core/error.h"
#include "hyla/data/pre_tokenizer.h"
#include "hyla/data/regex.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tiktoken.h"
#include "hyla/io/base64.h"
#include "hyla/io/json_fields.h"
#include "test_util.h"

namespace hyla {
namespace {

using test::TempDir;

// The 256 bytes, then `merged` tokens in rank order.
std::string ranks_file(const std::vector<std::string>& merged) {
  std::string out;
  int rank = 0;
  for (int b = 0; b < 256; ++b) out += base64_encode(std::string(1, char(b))) + " " + std::to_string(rank++) + "\n";
  for (const std::string& t : merged) out += base64_encode(t) + " " + std::to_string(rank++) + "\n";
  return out;
}

const std::vector<std::string> kMerged = {"th", "he", "the", " t", " the", "in", "ing", " th", "an", "and", " and",
                                          "er", "ther", "ea", "eat", " e", "at", "ate", "ll", "ell"};

// tiktoken's encoder: a piece that is a token is taken whole, else the lowest-ranked adjacent pair
// is merged until none is a token.
std::vector<int32_t> reference_encode(std::string_view piece, const std::unordered_map<std::string, int32_t>& rank) {
  if (auto it = rank.find(std::string(piece)); it != rank.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  for (;;) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (auto it = rank.find(parts[i] + parts[i + 1]); it != rank.end() && it->second < best) best = it->second, at = i;
    if (best == INT32_MAX) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + std::ptrdiff_t(at) + 1);
  }
  std::vector<int32_t> ids;
  for (const std::string& p : parts) ids.push_back(rank.at(p));
  return ids;
}

TEST(Tiktoken, EncodesAsTiktokenDoes) {
  const std::string ranks = ranks_file(kMerged);
  const Tokenizer tok(tokenizer_spec_from_tiktoken(ranks, R"(\s+|\S+)", "test"), "test");
  std::unordered_map<std::string, int32_t> rank;
  for (int b = 0; b < 256; ++b) rank[std::string(1, char(b))] = b;
  for (size_t i = 0; i < kMerged.size(); ++i) rank[kMerged[i]] = int32_t(256 + i);
  std::mt19937 rng(3);
  const std::string letters = "theanidgrl ";
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    for (int i = 0; i < 1 + int(rng() % 40); ++i) text += letters[rng() % letters.size()];
    std::vector<int32_t> want;
    size_t i = 0;
    while (i < text.size()) {  // runs of spaces and of non-spaces, as the pattern splits
      size_t j = i;
      const bool space = text[i] == ' ';
      while (j < text.size() && (text[j] == ' ') == space) ++j;
      for (int32_t id : reference_encode(std::string_view(text).substr(i, j - i), rank)) want.push_back(id);
      i = j;
    }
    ASSERT_EQ(tok.encode(text), want) << "'" << text << "'";
    ASSERT_EQ(tok.decode(tok.encode(text)), text);
  }
}

TEST(Tiktoken, RoundTripsRandomBytesWithKimisPattern) {
  const Tokenizer tok(tokenizer_spec_from_tiktoken(ranks_file(kMerged), kKimiPattern, "test"), "test");
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(size_t(rng() % 200), '\0');
    for (char& c : bytes) c = char(rng());
    ASSERT_EQ(tok.decode(tok.encode(bytes)), bytes);
  }
  // The text llama.cpp's converter identifies pre-tokenizers by (convert_hf_to_gguf_update.py's CHK_TXT).
  const std::string chk =
      "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 "
      "333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
      "------======= нещо на Български ```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you "
      "sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";
  for (std::string text : {chk, std::string("Hello世界 don't 12345\n\n  x"),
                           std::string("def f(x):\n    return x**2  # 平方\r\n"), std::string("Ünïcödé ÇAPS'LL 🙂🙂 e\u0301")})
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(Tiktoken, KimiPatternSplitsAsTokenizationKimi) {
  PreTokenizerConfig config;
  config.splits.push_back({std::string(kKimiPattern), false});
  const PreTokenizer pre(config, "kimi");
  auto pieces = [&](std::string_view text) {
    RegexMatchData scratch;
    std::vector<std::string> out;
    pre.split(text, scratch, [&](std::string_view p) { out.emplace_back(p); });
    return out;
  };
  // Han runs apart from Latin letters, a contraction kept on its word, digits in threes, spaces.
  EXPECT_EQ(pieces("Hello世界 don't 12345"),
            (std::vector<std::string>{"Hello", "世界", " don't", " ", "123", "45"}));
  EXPECT_EQ(pieces("CamelCase HTTPServer"), (std::vector<std::string>{"Camel", "Case", " HTTPServer"}));
  EXPECT_EQ(pieces("a  b\n\nc"), (std::vector<std::string>{"a", " ", " b", "\n\n", "c"}));
  // Runs of one case thousands of letters long (DNA, base64, minified text) exhaust PCRE2's default
  // 32 KiB JIT stack on this pattern; they split as any run does, however long.
  std::string dna;
  for (int i = 0; i < 1500; ++i) dna += "ACGT";
  EXPECT_EQ(pieces(dna), (std::vector<std::string>{dna}));
  for (size_t n : {size_t(6000), size_t(1) << 20}) {
    const std::string run(n, 'x');
    EXPECT_EQ(pieces(" " + run + "!"), (std::vector<std::string>{" " + run, "!"})) << n;
  }
}

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return h;
}

// A case's text: its pieces drawn by the 64-bit LCG scripts/kimi-pretokenizer-goldens.sh draws with.
std::string draw_text(const nlohmann::json& c) {
  const auto pieces = c["pieces"].get<std::vector<std::string>>();
  uint64_t state = c["seed"].get<uint64_t>();
  std::string text;
  while (text.size() < c["bytes"].get<size_t>()) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    text += pieces[(state >> 33) % pieces.size()];
  }
  return text;
}

// Issue 65: 1 MiB runs of one letter, of upper-case letters, of digits, of whitespace, of unspaced
// letters of five scripts and of mixed scripts encode to the ids llama.cpp's Kimi tokenizer gave
// (scripts/kimi-pretokenizer-goldens.sh): no run is too long to split, and none splits otherwise.
TEST(Tiktoken, KimiPreTokenizerMatchesLlamaCppOnMegabyteRuns) {
  const auto dir = test::source_dir() / "tests/data/kimi-pretokenizer";
  const Tokenizer tokenizer = load_model_tokenizer(dir);
  const nlohmann::json cases = parse_json_file((dir / "cases.json").string());
  ASSERT_EQ(cases.size(), 6u);
  for (const nlohmann::json& c : cases) {
    const std::string name = c["name"], text = draw_text(c);
    ASSERT_EQ(fmt::format("{:016x}", fnv1a(text)), c["text_fnv1a"]) << name << ": the text is not the script's";
    const std::vector<int32_t> ids = tokenizer.encode(text, /*allow_special=*/false);
    ASSERT_EQ(ids.size(), c["ids"].get<size_t>()) << name;
    const auto first = c["first_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + int64_t(first.size())), first) << name;
    const std::string_view id_bytes(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
    EXPECT_EQ(fmt::format("{:016x}", fnv1a(id_bytes)), c["ids_fnv1a"]) << name;  // little-endian int32s
  }
}

TEST(Tiktoken, KimiCheckpointTokenizerHasItsSpecials) {
  TempDir dir;
  test::write_bytes(dir / "tiktoken.model", ranks_file(kMerged));
  const int32_t base = 256 + int32_t(kMerged.size());
  test::write_bytes(dir / "tokenizer_config.json",
                    nlohmann::json{{"added_tokens_decoder",
                                    {{std::to_string(base), {{"content", "[BOS]"}, {"special", true}}},
                                     {std::to_string(base + 2), {{"content", "<|im_end|>"}, {"special", true}}}}}}
                        .dump());
  const Tokenizer tok = load_model_tokenizer(dir.path());
  EXPECT_EQ(tok.vocab_size(), base + 256);
  EXPECT_EQ(tok.special_id("[BOS]"), base);
  EXPECT_EQ(tok.special_id("<|im_end|>"), base + 2);
  EXPECT_EQ(tok.special_id("<|reserved_token_" + std::to_string(base + 1) + "|>"), base + 1);
  EXPECT_EQ(tok.encode("the<|im_end|>", /*allow_special=*/true), (std::vector<int32_t>{258, base + 2}));
  // Saved as tokenizer.json, it reads back as the same tokenizer.
  tok.save(dir / "tokenizer.json");
  const Tokenizer back = Tokenizer::load(dir / "tokenizer.json");
  for (std::string text : {"the heat and the eating", "<|im_end|>x"})
    EXPECT_EQ(back.encode(text, true), tok.encode(text, true)) << text;
}

TEST(Tiktoken, BadFilesNameTheLine) {
  test::expect_error([] { tokenizer_spec_from_tiktoken("dGg= 0\naGU= 5\n", kKimiPattern, "t.model"); }, "t.model:2");
  test::expect_error([] { tokenizer_spec_from_tiktoken("dGg=\n", kKimiPattern, "t.model"); }, "t.model:1");
  test::expect_error([] { tokenizer_spec_from_tiktoken("!!!! 0\n", kKimiPattern, "t.model"); }, "t.model:1");
  test::expect_error([] { tokenizer_spec_from_tiktoken("YQ== 0\n", kKimiPattern, "t.model"); }, "no token for the byte 0x00");
  std::string missing_pair = ranks_file({}) + base64_encode("abc") + " 256\n";
  test::expect_error([&] { tokenizer_spec_from_tiktoken(missing_pair, kKimiPattern, "t.model"); }, "token 256");
}

}  // namespace
}  // namespace hyla
