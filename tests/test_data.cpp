#include <gtest/gtest.h>
#include <zlib.h>

#include <array>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "hyla/core/error.h"
#include "hyla/core/progress.h"
#include "hyla/core/random.h"
#include "hyla/core/threads.h"
#include "hyla/data/corpus.h"
#include "hyla/data/fashion_mnist.h"
#include "hyla/data/image_file.h"
#include "hyla/data/image_records.h"
#include "hyla/data/loader.h"
#include "hyla/data/prepare.h"
#include "hyla/data/token_shard.h"
#include "hyla/io/file.h"
#include "hyla/io/gzip.h"
#include "hyla/io/json_fields.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using test::expect_error;

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string gzip(const std::string& bytes) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&s, uLong(bytes.size())), '\0');
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  s.avail_in = uInt(bytes.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

std::string big_endian(std::initializer_list<uint32_t> words) {
  std::string out;
  for (uint32_t w : words)
    for (int shift = 24; shift >= 0; shift -= 8) out += char((w >> shift) & 0xFF);
  return out;
}

std::vector<std::string> documents_of(std::string_view text) {
  std::vector<std::string> docs;
  for (std::string_view d = next_document(text); !d.empty(); d = next_document(text)) docs.emplace_back(d);
  return docs;
}

TEST(Rng, PickDrawsInProportionToTheWeights) {
  Rng rng(5);
  const std::vector<double> cumulative = {1, 1, 4};  // weights 1, 0, 3
  std::array<int, 3> counts{};
  for (int i = 0; i < 4000; ++i) ++counts[rng.pick(cumulative)];
  EXPECT_EQ(counts[1], 0);
  EXPECT_NEAR(counts[2] / 4000.0, 0.75, 0.03);
  EXPECT_EQ(rng.pick(std::vector<double>{2.5}), 0u);
}

TEST(Corpus, DocumentsAreBlankLineSeparatedBlocks) {
  EXPECT_EQ(documents_of("a\nb\n\n\nc\n \t\r\n d\n"), (std::vector<std::string>{"a\nb", "c", " d"}));
  EXPECT_EQ(documents_of("\n\nonly one\nblock"), (std::vector<std::string>{"only one\nblock"}));
  EXPECT_TRUE(documents_of("\n  \n").empty());
}

TEST(Corpus, KjvTextDropsReferencesAndSeparatesChapters) {
  const std::string out = "Ge1:1 In the beginning.\nGe1:2 And the earth.\nGe2:1 Thus the heavens.\n"
                          "1Sm1:1 Now there was.\nRev22:21 The grace.";
  EXPECT_EQ(kjv_plain_text(out), "In the beginning.\nAnd the earth.\n\nThus the heavens.\n\nNow there was.\n\nThe grace.\n");
  expect_error([] { kjv_plain_text("Ge1:1 fine\nno reference here\n"); }, "bible output line 2: no verse reference");
}

TEST(Corpus, KjvFromTheBibleProgram) {
  if (std::system("command -v bible >/dev/null 2>&1") != 0) GTEST_SKIP() << "bible-kjv is not installed";
  const std::string text = kjv_text();
  EXPECT_GT(text.size(), 4'000'000u);
  EXPECT_LT(text.size(), 4'500'000u);
  EXPECT_EQ(text.rfind("In the beginning God created the heaven and the earth.\n", 0), 0u);
  EXPECT_EQ(documents_of(text).size(), 1189u);  // chapters
  EXPECT_EQ(text.find("Ge1:"), std::string::npos);
}

TEST(Corpus, DevilTextStartsAtThePrefaceWithOneSentenceALine) {
  const std::string dict = "00-database-short\n     The Devil's Dictionary\n\n      PREFACE\n\n"
                           "_The Devil's Dictionary_ was begun in 1881.  It went on\nuntil 1906, \"slowly.\" Then it ended!\n\n"
                           "ZEUS, n.  The chief of Grecian gods, adored\nby the Romans as Jupiter.\n"
                           "    He zedjagged so wyde\n    Thet non coude pas.\n\n abcdefghijklmnopqrstuvwxyz\n";
  EXPECT_EQ(devil_plain_text(dict),
            "The Devil's Dictionary was begun in 1881.\nIt went on until 1906, \"slowly.\"\nThen it ended!\n\n"
            "ZEUS, n.\nThe chief of Grecian gods, adored by the Romans as Jupiter.\nHe zedjagged so wyde Thet non coude pas.\n");
  expect_error([] { devil_plain_text("EXCESS, n.  In morals.\n"); }, "not The Devil's Dictionary: it has no PREFACE line");
}

// Debian's dict-devil, which scripts/setup.sh installs.
TEST(Corpus, DevilFromTheDebianPackage) {
  const std::string text = devil_text();
  EXPECT_GT(text.size(), 300'000u);
  EXPECT_LT(text.size(), 400'000u);
  EXPECT_EQ(text.rfind("The Devil's Dictionary was begun in a weekly paper in 1881, and was continued", 0), 0u);
  EXPECT_NE(text.find("\nZOOLOGY, n.\nThe science and history of the animal kingdom"), std::string::npos);
  EXPECT_EQ(text.find('_'), std::string::npos);
  EXPECT_GT(documents_of(text).size(), 900u);
}

TEST(TokenShard, WritesTheDocumentedHeaderAndReadsBack) {
  test::TempDir dir;
  for (int32_t vocab : {1000, 100000}) {
    const fs::path path = dir / ("shard" + std::to_string(vocab));
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 5000; ++i) ids.push_back((i * 7919) % vocab);
    TokenShardWriter writer(path, vocab);
    writer.append(std::span(ids).first(1234));
    writer.append(std::span(ids).subspan(1234));
    writer.commit();
    const uint32_t token_bytes = vocab <= 65536 ? 2 : 4;
    const std::string bytes = read_file(path);
    ASSERT_EQ(bytes.size(), 32 + ids.size() * token_bytes);
    EXPECT_EQ(bytes.substr(0, 8), "HYLATOK1");
    uint32_t fields[4];
    uint64_t count;
    std::memcpy(fields, bytes.data() + 8, 16);
    std::memcpy(&count, bytes.data() + 24, 8);
    EXPECT_EQ(fields[0], 1u);
    EXPECT_EQ(fields[1], token_bytes);
    EXPECT_EQ(fields[2], uint32_t(vocab));
    EXPECT_EQ(fields[3], 0u);
    EXPECT_EQ(count, ids.size());
    const TokenShard shard(path);
    EXPECT_EQ(shard.size(), ids.size());
    std::vector<int32_t> back(ids.size());
    shard.read(0, back);
    EXPECT_EQ(back, ids);
    std::vector<int32_t> part(10);
    shard.read(4990, part);
    EXPECT_EQ(part, std::vector<int32_t>(ids.end() - 10, ids.end()));
  }
}

TEST(TokenShard, RejectsDamagedFiles) {
  test::TempDir dir;
  const fs::path path = dir / "good.bin";
  TokenShardWriter writer(path, 500);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  writer.append(ids);
  writer.commit();
  const std::string good = read_file(path);
  auto write_variant = [&](const std::string& name, std::string bytes) {
    test::write_bytes(dir / name, bytes);
    return dir / name;
  };
  expect_error([&] { TokenShard(write_variant("cut.bin", good.substr(0, good.size() - 3))); },
               "cut.bin: truncated token shard: the header says 5 tokens");
  expect_error([&] { TokenShard(write_variant("tiny.bin", good.substr(0, 10))); }, "tiny.bin: truncated token shard");
  std::string magic = good;
  magic[0] = 'X';
  expect_error([&] { TokenShard(write_variant("magic.bin", magic)); }, "magic.bin: not a hyla token shard (wrong magic)");
  std::string version = good;
  version[8] = 9;
  expect_error([&] { TokenShard(write_variant("version.bin", version)); }, "token shard version 9 is not supported");
  std::string extra = good + "zz";
  expect_error([&] { TokenShard(write_variant("extra.bin", extra)); }, "malformed token shard");
  std::string bad_id = good;
  bad_id[32] = char(0xFF), bad_id[33] = char(0xFF);  // id 65535 in a 500-token vocabulary
  const TokenShard shard(write_variant("id.bin", bad_id));
  std::vector<int32_t> out(5);
  expect_error([&] { shard.read(0, out); }, "id.bin: corrupt token shard: id 65535");
  expect_error([&] { TokenShard(dir / "missing.bin"); }, "missing.bin: cannot open");
}

// A prepared directory from sample text: 80 documents.
struct PreparedData {
  test::TempDir dir;
  fs::path tokenizer_file, corpus, out;
  PreparedData() {
    tokenizer_file = dir / "tokenizer.json";
    test::small_tokenizer().save(tokenizer_file);
    corpus = dir / "corpus.txt";
    test::write_bytes(corpus, test::sample_text(80, 11));
    out = dir / "prepared";
  }
  PrepareSummary prepare(const fs::path& out_dir, uint64_t seed = 5, double val_fraction = 0.1,
                         uint64_t shard_tokens = uint64_t(1) << 28) {
    PrepareOptions options;
    options.inputs = {corpus};
    options.out_dir = out_dir;
    options.seed = seed;
    options.val_fraction = val_fraction;
    options.shard_tokens = shard_tokens;
    return prepare_token_dataset(test::small_tokenizer(), tokenizer_file, options);
  }
};

std::vector<int32_t> all_tokens(const fs::path& path) {
  const TokenShard shard(path);
  std::vector<int32_t> ids(shard.size());
  shard.read(0, ids);
  return ids;
}

TEST(Prepare, WritesDocumentsWithEndOfTextAndAHeldOutSplit) {
  PreparedData data;
  const PrepareSummary s = data.prepare(data.out);
  EXPECT_EQ(s.documents[0] + s.documents[1], 80u);
  EXPECT_EQ(s.documents[1], 8u);  // round(0.1 * 80)
  const Tokenizer& tok = test::small_tokenizer();
  const int32_t eot = tok.special_id("<|endoftext|>");
  std::vector<int32_t> train = all_tokens(data.out / "train-00000.bin"), val = all_tokens(data.out / "val-00000.bin");
  EXPECT_EQ(train.size(), s.tokens[0]);
  EXPECT_EQ(val.size(), s.tokens[1]);
  EXPECT_EQ(std::count(train.begin(), train.end(), eot), 72);
  EXPECT_EQ(std::count(val.begin(), val.end(), eot), 8);
  EXPECT_EQ(train.back(), eot);
  // Every document appears exactly once across the splits, whole.
  std::multiset<std::string> expected, found;
  for (const std::string& d : documents_of(read_file(data.corpus))) expected.insert(d);
  for (const auto* ids : {&train, &val}) {
    std::vector<int32_t> doc;
    for (int32_t id : *ids) {
      if (id == eot) found.insert(tok.decode(doc)), doc.clear();
      else doc.push_back(id);
    }
  }
  EXPECT_EQ(found, expected);
  const json meta = parse_json_file((data.out / "meta.json").string());
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], tok.vocab_size());
  EXPECT_EQ(meta["splits"]["val"]["documents"], 8);
  EXPECT_EQ(meta["splits"]["train"]["shards"], json::array({"train-00000.bin"}));
  EXPECT_EQ(meta["seed"], 5);
}

TEST(Prepare, IsDeterministicForASeedWhateverTheThreadCount) {
  PreparedData data;
  const int threads = num_threads();
  set_threads(1);
  data.prepare(data.dir / "one", 5, 0.1, 2000);
  set_threads(2);
  const PrepareSummary s = data.prepare(data.dir / "two", 5, 0.1, 2000);
  data.prepare(data.dir / "other_seed", 6, 0.1, 2000);
  set_threads(threads);
  EXPECT_GT(s.shards[0].size(), 1u) << "small shards: documents spread over several";
  for (const auto& name : {"meta.json", "train-00000.bin", "train-00001.bin", "val-00000.bin"})
    EXPECT_EQ(read_file(data.dir / "one" / name), read_file(data.dir / "two" / name)) << name;
  EXPECT_NE(read_file(data.dir / "one" / "val-00000.bin"), read_file(data.dir / "other_seed" / "val-00000.bin"));
}

TEST(Prepare, RejectsBadInput) {
  PreparedData data;
  test::write_bytes(data.dir / "empty.txt", "");
  test::write_bytes(data.dir / "blank.txt", "\n \n\n");
  test::write_bytes(data.dir / "binary.txt", std::string("ab\0c", 4));
  auto prepare = [&](const fs::path& input, double val_fraction = 0.01) {
    PrepareOptions options;
    options.inputs = {input};
    options.out_dir = data.out;
    options.val_fraction = val_fraction;
    prepare_token_dataset(test::small_tokenizer(), data.tokenizer_file, options);
  };
  expect_error([&] { prepare(data.dir / "empty.txt"); }, "empty.txt: empty file");
  expect_error([&] { prepare(data.dir / "blank.txt"); }, "blank.txt: no documents");
  expect_error([&] { prepare(data.dir / "binary.txt"); }, "binary.txt: binary file (NUL byte at offset 2)");
  test::write_bytes(data.dir / "one_doc.txt", "just one document\n");
  expect_error([&] { prepare(data.dir / "one_doc.txt"); }, "leaving none for training");
  EXPECT_FALSE(fs::exists(data.out)) << "a failed prepare leaves nothing behind";
}

TEST(Loader, RandomBatchesResumeExactlyFromASavedState) {
  PreparedData data;
  data.prepare(data.out);
  TokenLoader loader = TokenLoader::from_directory(data.out, "train", 4, 16, LoaderMode::Random, 123);
  TokenWindows batch;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.rows, 4);
  EXPECT_EQ(batch.width, 17);
  EXPECT_EQ(batch.used_rows(), 4);
  const std::string saved = loader.state().dump();
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 4; ++i) {
    loader.next(batch);
    expected.push_back(batch.tokens);
  }
  TokenLoader resumed = TokenLoader::from_directory(data.out, "train", 4, 16, LoaderMode::Random, 999);
  resumed.set_state(json::parse(saved));
  for (int i = 0; i < 4; ++i) {
    resumed.next(batch);
    EXPECT_EQ(batch.tokens, expected[size_t(i)]) << "batch " << i;
  }
  EXPECT_EQ(resumed.state(), loader.state());
  // Each row is a real window of the shard.
  const std::vector<int32_t> train = all_tokens(data.out / "train-00000.bin");
  const json state = loader.state();
  const auto offset = state["offset"].get<uint64_t>();
  EXPECT_TRUE(std::equal(batch.tokens.end() - 17, batch.tokens.end(), train.begin() + ptrdiff_t(offset)));
}

TEST(Loader, SequentialPassCoversEveryTargetOnceAndReportsThePartialWindow) {
  PreparedData data;
  data.prepare(data.out);
  const std::vector<int32_t> val = all_tokens(data.out / "val-00000.bin");
  const int64_t T = 32;
  TokenLoader loader = TokenLoader::from_directory(data.out, "val", 3, T, LoaderMode::Sequential);
  ASSERT_EQ((val.size() - 1) % T == 0, false) << "this test wants a partial last window";
  EXPECT_EQ(loader.windows_per_pass(), (val.size() - 2) / T + 1);
  EXPECT_EQ(loader.partial_windows_per_pass(), 1u);
  std::vector<int32_t> targets;
  TokenWindows batch;
  uint64_t windows = 0, partial = 0;
  while (loader.next(batch)) {
    for (int64_t r = 0; r < batch.rows; ++r) {
      const int32_t length = batch.lengths[size_t(r)];
      if (length == 0) continue;
      ++windows;
      partial += length < T + 1;
      const int32_t* row = batch.tokens.data() + r * batch.width;
      targets.insert(targets.end(), row + 1, row + length);
      for (int64_t c = length; c < batch.width; ++c) EXPECT_EQ(row[c], -1);
    }
  }
  EXPECT_EQ(windows, loader.windows_per_pass());
  EXPECT_EQ(partial, 1u);
  EXPECT_EQ(targets, std::vector<int32_t>(val.begin() + 1, val.end()));
  EXPECT_FALSE(loader.next(batch)) << "the pass is over";
}

TEST(Loader, SequenceLengthChangesMidStreamAndSurvivesResume) {
  PreparedData data;
  data.prepare(data.out);
  TokenLoader loader = TokenLoader::from_directory(data.out, "train", 2, 8, LoaderMode::Sequential);
  TokenWindows batch;
  loader.next(batch);
  EXPECT_EQ(batch.width, 9);
  loader.set_seq_len(20);
  const json saved = loader.state();
  EXPECT_EQ(saved["seq_len"], 20);
  ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.width, 21);
  // The windows continue where the shorter ones stopped: offset 2 * 8.
  const std::vector<int32_t> train = all_tokens(data.out / "train-00000.bin");
  EXPECT_TRUE(std::equal(batch.tokens.begin(), batch.tokens.begin() + 21, train.begin() + 16));
  TokenLoader resumed = TokenLoader::from_directory(data.out, "train", 2, 8, LoaderMode::Sequential);
  resumed.set_state(saved);
  EXPECT_EQ(resumed.seq_len(), 20);
  TokenWindows again;
  resumed.next(again);
  EXPECT_EQ(again.tokens, batch.tokens);
  // Random mode follows the new length too.
  TokenLoader random = TokenLoader::from_directory(data.out, "train", 2, 8, LoaderMode::Random, 1);
  random.set_seq_len(64);
  random.next(batch);
  EXPECT_EQ(batch.width, 65);
}

TEST(Loader, RejectsMismatchedStatesAndImpossibleWindows) {
  PreparedData data;
  data.prepare(data.out);
  TokenLoader loader = TokenLoader::from_directory(data.out, "train", 2, 8, LoaderMode::Random, 1);
  json state = loader.state();
  TokenLoader other = TokenLoader::from_directory(data.out, "train", 3, 8, LoaderMode::Random, 1);
  expect_error([&] { other.set_state(state); }, "batch_size 2 does not match this loader's 3");
  TokenLoader sequential = TokenLoader::from_directory(data.out, "train", 2, 8, LoaderMode::Sequential);
  expect_error([&] { sequential.set_state(state); }, "mode 'random' does not match");
  state["rng"][0] = "xyz";
  expect_error([&] { loader.set_state(state); }, "rng[0] 'xyz' is not a hex number");
  expect_error([&] { TokenLoader::from_directory(data.out, "train", 2, 10'000'000, LoaderMode::Random); },
               "no token shard holds a window");
  expect_error([&] { TokenLoader::from_directory(data.out, "test", 2, 8, LoaderMode::Random); },
               "meta.json: no list splits.test.shards");
}

TEST(ImageRecords, RoundTripAndTokenSequence) {
  test::TempDir dir;
  const fs::path path = dir / "images.bin";
  std::vector<std::vector<uint8_t>> images;
  ImageRecordWriter writer(path);
  const int dims[3][3] = {{28, 28, 1}, {4, 6, 3}, {1, 1, 1}};
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> pixels(size_t(dims[i][0] * dims[i][1] * dims[i][2]));
    for (size_t p = 0; p < pixels.size(); ++p) pixels[p] = uint8_t(p * 31 + size_t(i));
    writer.add(pixels, dims[i][0], dims[i][1], dims[i][2], i == 2 ? "" : "a photo of a sneaker " + std::to_string(i),
               i == 1 ? -1 : i, i == 1 ? 8 : 0);
    images.push_back(std::move(pixels));
  }
  writer.commit();
  const ImageRecordReader reader(path);
  ASSERT_EQ(reader.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const ImageRecord r = reader.record(uint64_t(i));
    EXPECT_EQ(r.height, dims[i][0]);
    EXPECT_EQ(r.width, dims[i][1]);
    EXPECT_EQ(r.channels, dims[i][2]);
    EXPECT_EQ(r.label, i == 1 ? -1 : i);
    EXPECT_EQ(std::vector<uint8_t>(r.pixels.begin(), r.pixels.end()), images[size_t(i)]);
    EXPECT_EQ(r.caption, i == 2 ? "" : "a photo of a sneaker " + std::to_string(i));
    EXPECT_EQ(r.prompt_bytes, i == 1 ? 8 : 0);  // "a photo " is record 1's prompt
  }
  EXPECT_EQ(reader.record(0).caption, "a photo of a sneaker 0");

  const std::string good = read_file(path);
  test::write_bytes(dir / "cut.bin", good.substr(0, good.size() - 5));
  expect_error([&] { ImageRecordReader(dir / "cut.bin"); }, "cut.bin: truncated or malformed image records");
  test::write_bytes(dir / "magic.bin", "NOTMAGIC" + good.substr(8));
  expect_error([&] { ImageRecordReader(dir / "magic.bin"); }, "magic.bin: not a hyla image record file");
  std::string overrun = good;
  overrun[32] = char(0x7F);  // record 0's height, now far past the file
  test::write_bytes(dir / "overrun.bin", overrun);
  expect_error([&] { ImageRecordReader(dir / "overrun.bin"); }, "overrun.bin: record 0");
}

// Overwrites a little-endian u32 of a record file.
void put_u32(std::string& bytes, size_t at, uint32_t value) { std::memcpy(bytes.data() + at, &value, 4); }

TEST(ImageRecords, Version1FilesReadWithEmptyPromptsAndPromptsAreChecked) {
  test::TempDir dir;
  const fs::path path = dir / "v2.bin";
  ImageRecordWriter writer(path);
  const std::vector<uint8_t> pixels = {1, 2, 3, 4};
  writer.add(pixels, 2, 2, 1, "Q: what? A: yes", 5, 11);
  writer.commit();
  const std::string v2 = read_file(path);
  uint32_t version;
  std::memcpy(&version, v2.data() + 8, 4);
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(ImageRecordReader(path).record(0).prompt_bytes, 11);
  // Version 1: the same bytes with the field reserved; a non-zero value there is not a prompt.
  std::string v1 = v2;
  put_u32(v1, 8, 1);
  test::write_bytes(dir / "v1.bin", v1);
  const ImageRecordReader reader(dir / "v1.bin");  // the record's views point into its mapping
  const ImageRecord old = reader.record(0);
  EXPECT_EQ(old.prompt_bytes, 0);
  EXPECT_EQ(old.caption, "Q: what? A: yes");
  EXPECT_EQ(old.label, 5);
  std::string long_prompt = v2;
  put_u32(long_prompt, 32 + 20, 16);  // record 0's prompt bytes, one past its 15-byte caption
  test::write_bytes(dir / "prompt.bin", long_prompt);
  expect_error([&] { ImageRecordReader(dir / "prompt.bin"); }, "prompt.bin: record 0 has a 16-byte prompt in a 15-byte caption");
  std::string v3 = v2;
  put_u32(v3, 8, 3);
  test::write_bytes(dir / "v3.bin", v3);
  expect_error([&] { ImageRecordReader(dir / "v3.bin"); }, "v3.bin: image record version 3 is not supported (hyla reads 1 and 2)");
}

// Images for `prepare-images --input` lists: PNGs under imgs/, a grey 4x6 and an RGB 5x5.
struct ImageList {
  test::TempDir dir;
  fs::path list = dir / "list.jsonl";
  Image grey{4, 6, 1, {}}, rgb{5, 5, 3, {}};
  ImageList() {
    fs::create_directories(dir / "imgs");
    for (Image* image : {&grey, &rgb}) {
      image->pixels.resize(size_t(image->height * image->width * image->channels));
      for (size_t i = 0; i < image->pixels.size(); ++i) image->pixels[i] = uint8_t(i * 13 + 1);
    }
    test::write_bytes(dir / "imgs" / "grey.png", encode_png(grey));
    test::write_bytes(dir / "imgs" / "rgb.png", encode_png(rgb));
  }
};

TEST(PrepareImages, ListsOfCaptionsAndQuestions) {
  ImageList data;
  std::string lines;
  for (int i = 0; i < 10; ++i) {
    if (i % 2 == 0) lines += fmt::format("{{\"image\": \"imgs/grey.png\", \"text\": \"a grey patch {}\"}}\n", i);
    else lines += fmt::format("{{\"image\": \"{}\", \"question\": \"Q: which one? A:\", \"answer\": \" rgb {}\", \"label\": {}}}\n",
                              (data.dir / "imgs" / "rgb.png").string(), i, i);
    if (i == 4) lines += "\n  \n";
  }
  test::write_bytes(data.list, lines);
  const fs::path out = data.dir / "out";
  const std::string args = "data prepare-images --input " + data.list.string() +
                           " --val-fraction 0.2 --test-fraction 0.1 --seed 4 --out ";
  auto r = test::run_hyla(args + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json meta = parse_json_file((out / "meta.json").string());
  EXPECT_EQ(meta["version"], 2);
  EXPECT_EQ(meta["splits"]["train"]["records"], 7);
  EXPECT_EQ(meta["splits"]["val"]["records"], 2);
  EXPECT_EQ(meta["splits"]["test"]["records"], 1);
  std::multiset<std::string> captions;
  for (const char* split : {"train", "val", "test"}) {
    const json& m = meta["splits"][split];
    const ImageRecordReader reader(out / m["file"].get<std::string>());
    ASSERT_EQ(reader.size(), m["records"].get<uint64_t>());
    bool mixed = false;
    for (uint64_t i = 0; i < reader.size(); ++i) {
      const ImageRecord rec = reader.record(i);
      const std::string caption(rec.caption);
      captions.insert(caption);
      const bool asked = caption.rfind("Q: ", 0) == 0;
      const Image& image = asked ? data.rgb : data.grey;
      EXPECT_EQ(rec.prompt_bytes, asked ? 16 : 0) << caption;
      EXPECT_EQ(rec.label, asked ? std::stoi(caption.substr(20)) : -1) << caption;
      EXPECT_EQ(rec.channels, image.channels);
      EXPECT_EQ(std::vector<uint8_t>(rec.pixels.begin(), rec.pixels.end()), image.pixels);
      mixed |= rec.height != reader.record(0).height;
    }
    // Sizes are in meta.json only when every record of the split shares them.
    EXPECT_EQ(m.contains("height"), !mixed) << split;
  }
  EXPECT_EQ(captions.size(), 10u);
  EXPECT_EQ(captions.count("a grey patch 4"), 1u);
  EXPECT_EQ(captions.count("Q: which one? A: rgb 7"), 1u);
  // The split is the seed's: the same again, byte for byte.
  r = test::run_hyla(args + (data.dir / "again").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* file : {"train.bin", "val.bin", "test.bin"})
    EXPECT_EQ(read_file(out / file), read_file(data.dir / "again" / file)) << file;
}

TEST(PrepareImages, ABadLineIsOneErrorAndWritesNothing) {
  ImageList data;
  test::write_bytes(data.dir / "imgs" / "broken.png", "not an image");
  const std::string good = "{\"image\": \"imgs/grey.png\", \"text\": \"fine\"}\n";
  const std::pair<std::string, std::string> cases[] = {
      {"{\"image\": \"imgs/broken.png\", \"text\": \"x\"}", "list.jsonl line 3: " + (data.dir / "imgs" / "broken.png").string() + ": not a PNG or JPEG image"},
      {"{\"image\": \"imgs/none.png\", \"text\": \"x\"}", "list.jsonl line 3: " + (data.dir / "imgs" / "none.png").string() + ": cannot open"},
      {"{\"image\": \"imgs/grey.png\", \"text\": }", "list.jsonl line 3"},
      {"{\"image\": \"imgs/grey.png\"}", "list.jsonl line 3: imgs/grey.png: give either \"text\" (a caption) or both"},
      {"{\"image\": \"imgs/grey.png\", \"question\": \"Q: A:\"}", "line 3: imgs/grey.png: give either"},
      {"{\"image\": \"imgs/grey.png\", \"text\": \"x\", \"colour\": 1}", "list.jsonl line 3: unknown key colour"},
      {"{\"image\": \"imgs/grey.png\", \"text\": \"x\", \"label\": -2}", "line 3: imgs/grey.png: label must be 0 to 2147483647"},
  };
  for (const auto& [line, message] : cases) {
    test::write_bytes(data.list, good + good + line + "\n" + good);
    auto r = test::run_hyla("data prepare-images --input " + data.list.string() + " --out " + (data.dir / "out").string());
    EXPECT_EQ(r.exit_code, 1) << line;
    EXPECT_NE(r.output.find("error: " + (data.dir / "list.jsonl").string()), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(data.dir / "out")) << line;
  }
  auto r = test::run_hyla("data prepare-images --dataset fashion-mnist --input " + data.list.string() + " --out " +
                          (data.dir / "out").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("excludes"), std::string::npos) << r.output;
}

TEST(FashionMnist, ReadsIdxFilesAndRejectsDamagedOnes) {
  test::TempDir dir;
  // A tiny dataset in the real layout: 3 images of 2x2, labels 7, 9, 0.
  const std::string images = big_endian({0x803, 3, 2, 2}) + std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c", 12);
  const std::string labels = big_endian({0x801, 3}) + std::string("\x07\x09\x00", 3);
  test::write_bytes(dir / "t10k-images-idx3-ubyte.gz", gzip(images));
  test::write_bytes(dir / "t10k-labels-idx1-ubyte.gz", gzip(labels));
  const LabeledImages data = load_fashion_mnist(dir.path(), "test");
  EXPECT_EQ(data.images.count, 3);
  EXPECT_EQ(data.images.rows, 2);
  EXPECT_EQ(data.images.pixels[5], 6);
  EXPECT_EQ(data.labels, (std::vector<uint8_t>{7, 9, 0}));
  EXPECT_EQ(fashion_mnist_caption(7), "a photo of a sneaker");
  EXPECT_EQ(fashion_mnist_caption(9), "a photo of an ankle boot");
  EXPECT_EQ(fashion_mnist_caption(0), "a photo of a t-shirt/top");

  const fs::path bad = dir / "bad.gz";
  const std::string gz = gzip(images);
  test::write_bytes(bad, gz.substr(0, gz.size() / 2));
  expect_error([&] { read_idx_images(bad); }, "bad.gz: corrupt gzip data: truncated");
  std::string flipped = gz;
  flipped[12] = char(~flipped[12]);
  flipped[13] = char(~flipped[13]);
  test::write_bytes(bad, flipped);
  expect_error([&] { read_idx_images(bad); }, "bad.gz: corrupt gzip data");
  test::write_bytes(bad, images);
  expect_error([&] { read_idx_images(bad); }, "bad.gz: not a gzip file");
  test::write_bytes(bad, gzip(labels));
  expect_error([&] { read_idx_images(bad); }, "bad.gz: wrong idx magic number 0x00000801 (expected 0x00000803)");
  test::write_bytes(bad, gzip(images.substr(0, images.size() - 1)));
  expect_error([&] { read_idx_images(bad); }, "bad.gz: truncated idx file: the header promises 12 bytes of data, the file holds 11");
  test::write_bytes(dir / "t10k-labels-idx1-ubyte.gz", gzip(big_endian({0x801, 2}) + "\x01\x02"));
  expect_error([&] { load_fashion_mnist(dir.path(), "test"); }, "2 labels for the 3 images");
  test::write_bytes(dir / "t10k-labels-idx1-ubyte.gz", gzip(big_endian({0x801, 3}) + "\x01\x0c\x02"));
  expect_error([&] { load_fashion_mnist(dir.path(), "test"); }, "label 12 of image 1 is not a class");
}

TEST(FashionMnist, TheInstalledTestSplit) {
  if (!fs::exists(fs::path(kFashionMnistDir) / "t10k-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const LabeledImages data = load_fashion_mnist(kFashionMnistDir, "test");
  EXPECT_EQ(data.images.count, 10000);
  EXPECT_EQ(data.images.rows, 28);
  EXPECT_EQ(data.images.cols, 28);
  std::vector<int> per_class(10);
  for (uint8_t l : data.labels) ++per_class[l];
  for (int n : per_class) EXPECT_EQ(n, 1000);
}

TEST(Progress, CountsFromSeveralThreadsAndFormatsAmounts) {
  Progress progress("test", 1000, "items");
#pragma omp parallel for
  for (int i = 0; i < 1000; ++i) progress.advance(1);
  EXPECT_EQ(progress.done(), 1000u);
  progress.finish();
  EXPECT_EQ(format_amount(512, "B"), "512 B");
  EXPECT_EQ(format_amount(3.5 * 1024 * 1024, "B"), "3.5 MB");
  EXPECT_EQ(format_amount(1234567, "tok"), "1.23M tok");
}

TEST(DataCli, PrepareAndPrepareImages) {
  PreparedData data;
  auto r = test::run_hyla("--threads 2 data prepare --tokenizer " + data.tokenizer_file.string() + " --input " +
                          data.corpus.string() + " --out " + data.out.string() + " --val-fraction 0.05 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("val 4 documents"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(data.out / "meta.json"));

  test::write_bytes(data.dir / "t10k-images-idx3-ubyte.gz", gzip(big_endian({0x803, 2, 28, 28}) + std::string(2 * 784, '\x10')));
  test::write_bytes(data.dir / "t10k-labels-idx1-ubyte.gz", gzip(big_endian({0x801, 2}) + "\x07\x09"));
  const fs::path images = data.dir / "images";
  r = test::run_hyla("data prepare-images --dataset fashion-mnist --split test --dir " + data.dir.path().string() +
                     " --out " + images.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const ImageRecordReader reader(images / "test.bin");
  ASSERT_EQ(reader.size(), 2u);
  EXPECT_EQ(reader.record(1).caption, "a photo of an ankle boot");
  EXPECT_EQ(reader.record(1).label, 9);

  test::write_bytes(data.dir / "t10k-labels-idx1-ubyte.gz", "garbage");
  r = test::run_hyla("data prepare-images --split test --dir " + data.dir.path().string() + " --out " +
                     (data.dir / "images2").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("t10k-labels-idx1-ubyte.gz: not a gzip file"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(data.dir / "images2"));

  test::write_bytes(data.dir / "tok.json", "{\"model\": {\"type\": \"Unigram\"}, \"pre_tokenizer\": null}");
  r = test::run_hyla("data prepare --tokenizer " + (data.dir / "tok.json").string() + " --input " +
                     data.corpus.string() + " --out " + (data.dir / "x").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("tok.json: model.type 'Unigram' is not supported"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hyla
