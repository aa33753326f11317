// Images end to end: training sequences (which rows carry a loss), the record sampler's resume
// state, prompts with images (markers, chat turns), the evaluation's controls, base64 and Wilson
// intervals, and `hyla train --images` → `hyla eval images` on a tiny run (resume exact, report).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "hyla/data/chat_template.h"
#include "hyla/data/image_augment.h"
#include "hyla/data/image_batches.h"
#include "hyla/data/image_file.h"
#include "hyla/data/image_text.h"
#include "hyla/eval/image_eval.h"
#include "hyla/eval/interval.h"
#include "hyla/infer/engine.h"
#include "hyla/io/base64.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/train/train_config.h"
#include "model_test_util.h"
#include "test_util.h"
#include "text_fixtures.h"
#include "tiny_run.h"

namespace hyla {
namespace {

using json = nlohmann::json;

VisionConfig vision7() { return {.enabled = true, .patch_size = 7, .channels = 1, .max_grid = 8}; }

Image striped(int64_t h, int64_t w, uint8_t seed) {
  Image img{h, w, 1, std::vector<uint8_t>(size_t(h * w))};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = uint8_t(i * 31 + seed * 17);
  return img;
}

// Records of side×side grey images in two classes (bright or dark), with questions: half of them.
void write_records(const std::filesystem::path& file, int n, bool questions = true, int side = 14) {
  ImageRecordWriter writer(file);
  for (int i = 0; i < n; ++i) {
    const int label = i % 2;
    std::vector<uint8_t> pixels(size_t(side * side), uint8_t(label ? 230 : 20));
    pixels[size_t(i % (side * side))] = 128;
    if (!questions || i % 4 < 2) writer.add(pixels, side, side, 1, label ? "bright" : "dark", label);
    else writer.add(pixels, side, side, 1, label ? "Q: which? A: bright" : "Q: which? A: dark", label, 10);
  }
  writer.commit();
}

// A prepared image directory with only a train split of n write_records records.
void write_train_split(const std::filesystem::path& dir, int n, int side = 14) {
  write_records(dir / "train.bin", n, true, side);
  test::write_bytes(dir / "meta.json", json{{"format", "hyla-image-records"}, {"version", 2},
                                            {"splits", {{"train", {{"file", "train.bin"}, {"records", n}}}}}}.dump());
}

TEST(VisionData, SequencesScoreTheAnswerNotTheImageOrTheQuestion) {
  const Tokenizer& tok = test::small_tokenizer();
  test::TempDir dir;
  write_records(dir / "r.bin", 4);
  const ImageRecordReader records(dir / "r.bin");
  ImageSequences s;
  append_image_sequence(records.record(2), tok, vision7(), "r", s);  // "Q: which?" + " A: bright"... label 0: dark
  const std::vector<int32_t> question = tok.encode("Q: which? "), answer = tok.encode("A: dark");
  const int64_t pads = 4, span = pads + 2;
  ASSERT_EQ(s.lengths, std::vector<int64_t>{span + int64_t(question.size() + answer.size())});  // + EOT - 1
  ASSERT_EQ(s.images.size(), 1u);
  EXPECT_EQ(s.images[0].height, 14);
  for (int64_t r = 0; r < s.rows(); ++r) {
    const bool predicts_pad = r < pads;                      // <|image_start|> and the pads before the last
    const bool predicts_end = r == pads;                     // the last pad predicts <|image_end|>: scored
    const bool predicts_question = r > pads && r < span + int64_t(question.size()) - 1;
    if (predicts_pad || predicts_question) {
      EXPECT_EQ(s.targets[size_t(r)], -1) << r;
    } else {
      EXPECT_GE(s.targets[size_t(r)], 0) << r;
    }
    if (predicts_end) {
      EXPECT_EQ(s.targets[size_t(r)], tok.special_id("<|image_end|>"));
    }
  }
  EXPECT_EQ(s.targets.back(), tok.special_id("<|endoftext|>"));
}

TEST(VisionData, SamplerFillsItsBudgetAndResumesExactly) {
  const Tokenizer& tok = test::small_tokenizer();
  test::TempDir dir;
  write_train_split(dir.path(), 30);
  ImageRecordSampler a({dir.path()}, "train", tok, vision7(), 5), b({dir.path()}, "train", tok, vision7(), 5);
  ImageSequences sa, sb;
  a.next(100, sa);
  EXPECT_LE(sa.rows(), 100);
  EXPECT_GT(sa.rows(), 100 - 20);  // one more sequence would not have fitted
  b.set_state(a.state());
  a.next(100, sa);
  b.next(100, sb);
  EXPECT_EQ(sa.ids, sb.ids);
  EXPECT_EQ(sa.targets, sb.targets);
  EXPECT_THROW(ImageRecordSampler({dir.path()}, "val", tok, vision7(), 1), Error);
}

TEST(VisionData, SamplerDrawsDirectoriesByTheirWeights) {
  const Tokenizer& tok = test::small_tokenizer();
  test::TempDir big, small;  // 30 records of 14×14 and 10 of 7×7: by size, a quarter are small
  write_train_split(big.path(), 30, 14);
  write_train_split(small.path(), 10, 7);
  auto small_share = [&](const std::vector<double>& weights) {
    ImageRecordSampler sampler({big.path(), small.path()}, "train", tok, vision7(), 3, weights);
    ImageSequences s;
    int64_t drawn = 0, small_drawn = 0;
    while (drawn < 4000) {
      sampler.next(200, s);
      for (const Image& image : s.images) small_drawn += image.height == 7, ++drawn;
    }
    return double(small_drawn) / double(drawn);
  };
  EXPECT_NEAR(small_share({}), 0.25, 0.03);
  EXPECT_NEAR(small_share({1, 3}), 0.75, 0.03);  // weights of directories, not of records
  EXPECT_NEAR(small_share({10, 10}), 0.5, 0.03);
  EXPECT_THROW(ImageRecordSampler({big.path(), small.path()}, "train", tok, vision7(), 3, {1}), Error);
  EXPECT_THROW(ImageRecordSampler({big.path(), small.path()}, "train", tok, vision7(), 3, {1, 0}), Error);

  nlohmann::json j = {{"curriculum", json::array({{{"seq_len", 256}, {"tokens", 1024}, {"batch_tokens", 512}}})},
                      {"images", {{"ratio", 2.0}, {"weights", {1, -2}}}}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "t.json: images.weights (1, -2) must all be positive");
  j["images"]["weights"] = {1, "x"};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "images.weights must be a list of numbers");
  j["images"]["weights"] = {2, 0.5};
  const TrainConfig c = TrainConfig::from_json(j, "t.json");
  EXPECT_EQ(TrainConfig::from_json(c.to_json(), "again").image_weights, (std::vector<double>{2, 0.5}));
}

// The definition, pixel by pixel: result(y, x) = source(y - dy, x - dx) after an optional mirror.
Image shifted_reference(const Image& src, bool mirror, int64_t dy, int64_t dx) {
  Image out{src.height, src.width, src.channels, std::vector<uint8_t>(src.pixels.size(), 0)};
  for (int64_t y = 0; y < src.height; ++y)
    for (int64_t x = 0; x < src.width; ++x) {
      const int64_t sy = y - dy, sx0 = x - dx;
      if (sy < 0 || sy >= src.height || sx0 < 0 || sx0 >= src.width) continue;
      const int64_t sx = mirror ? src.width - 1 - sx0 : sx0;
      for (int64_t ch = 0; ch < src.channels; ++ch)
        out.pixels[size_t((y * src.width + x) * src.channels + ch)] =
            src.pixels[size_t((sy * src.width + sx) * src.channels + ch)];
    }
  return out;
}

TEST(VisionData, AugmentationMirrorsAndShiftsAsDefined) {
  Image rgb{5, 6, 3, std::vector<uint8_t>(90)};
  for (size_t i = 0; i < rgb.pixels.size(); ++i) rgb.pixels[i] = uint8_t(1 + i * 7 % 251);
  Rng rng(4);
  Image mirrored = rgb;
  augment_image({1.0, 0}, rng, mirrored);
  EXPECT_EQ(mirrored.pixels, shifted_reference(rgb, true, 0, 0).pixels);  // channels move with their pixel
  Image unchanged = rgb;
  augment_image({0.0, 0}, rng, unchanged);
  EXPECT_EQ(unchanged.pixels, rgb.pixels);

  // Every draw is one of the (2·2+1)² translations, each about equally often, mirrored about half the time.
  const Image grey = striped(9, 11, 3);
  std::map<std::tuple<bool, int64_t, int64_t>, int> seen;
  const int draws = 5000;
  for (int i = 0; i < draws; ++i) {
    Image img = grey;
    augment_image({0.5, 2}, rng, img);
    int matches = 0;
    for (bool mirror : {false, true})
      for (int64_t dy = -2; dy <= 2; ++dy)
        for (int64_t dx = -2; dx <= 2; ++dx)
          if (img.pixels == shifted_reference(grey, mirror, dy, dx).pixels) ++matches, ++seen[{mirror, dy, dx}];
    ASSERT_EQ(matches, 1) << "draw " << i;
    ASSERT_EQ(img.height, grey.height);
  }
  ASSERT_EQ(seen.size(), 50u);
  for (const auto& [key, n] : seen) EXPECT_NEAR(n, draws / 50.0, 40) << std::get<1>(key) << "," << std::get<2>(key);
}

TEST(VisionData, SamplerAugmentsItsDirectoryAndResumesExactly) {
  const Tokenizer& tok = test::small_tokenizer();
  test::TempDir dir;
  write_train_split(dir.path(), 30);
  ImageRecordSampler plain({dir.path()}, "train", tok, vision7(), 5);
  ImageRecordSampler a({dir.path()}, "train", tok, vision7(), 5, {}, {{0.5, 3}}),
      b({dir.path()}, "train", tok, vision7(), 5, {}, {{0.5, 3}});
  ImageSequences sp, sa, sb;
  plain.next(100, sp);
  a.next(100, sa);
  EXPECT_NE(sa.images.front().pixels, sp.images.front().pixels);  // the same first record, augmented
  EXPECT_EQ(sa.images.front().height, sp.images.front().height);
  b.set_state(a.state());
  a.next(100, sa);
  b.next(100, sb);
  EXPECT_EQ(sa.ids, sb.ids);
  ASSERT_EQ(sa.images.size(), sb.images.size());
  for (size_t i = 0; i < sa.images.size(); ++i) EXPECT_EQ(sa.images[i].pixels, sb.images[i].pixels);
  EXPECT_THROW(ImageRecordSampler({dir.path()}, "train", tok, vision7(), 5, {}, {{0.5, 3}, {}}), Error);

  nlohmann::json j = {{"curriculum", json::array({{{"seq_len", 256}, {"tokens", 1024}, {"batch_tokens", 512}}})},
                      {"images", {{"ratio", 2.0}, {"augment", {{{"flip", 1.5}}}}}}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "t.json: images.augment[0].flip (1.5) must lie in [0, 1]");
  j["images"]["augment"] = {{{"flip", 0.5}, {"rotate", 10}}};
  test::expect_error([&] { TrainConfig::from_json(j, "t.json"); }, "unknown key images.augment[0].rotate");
  j["images"]["augment"] = {{{"flip", 0.5}, {"shift", 2}}, json::object()};
  const TrainConfig c = TrainConfig::from_json(j, "t.json");
  const TrainConfig again = TrainConfig::from_json(c.to_json(), "again");
  ASSERT_EQ(again.image_augment.size(), 2u);
  EXPECT_EQ(again.image_augment[0].shift, 2);
  EXPECT_EQ(again.image_augment[0].flip, 0.5);
  EXPECT_FALSE(again.image_augment[1].any());
}

// Kimi K3 states an image in its prompt as <|media_begin|>image WxH<|media_content|>, a
// <|media_pad|> per position and <|media_end|>, W×H the size before the model's resize.
TEST(VisionPrompt, KimiK3PlacesAnImageAsItsMediaSpan) {
  TokenizerSpec spec = test::kimi_tokenizer(true).spec();
  int32_t next = test::kimi_tokenizer(true).vocab_size();
  for (const char* m : {"<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>"})
    spec.added_tokens.push_back({next++, m});
  const Tokenizer tok(std::move(spec), "kimi k3 markers and media");
  const ChatTemplate chat_template(tok);
  ASSERT_EQ(chat_template.format(), ChatFormat::KimiK3);
  Image image = striped(28, 56, 3);  // 1 × 2 positions of 28 pixels
  image.source_width = 100, image.source_height = 50;
  std::vector<ChatMessage> chat = {{"user", "What is it?", {}, {}, {}}};
  chat[0].images.push_back({0, image});
  const std::vector<int32_t> ids = chat_template.encode(chat, true, {}, 28);
  const auto begin = std::find(ids.begin(), ids.end(), tok.special_id("<|media_begin|>"));
  ASSERT_NE(begin, ids.end());
  std::vector<int32_t> want = tok.encode("image 100x50");
  want.insert(want.begin(), tok.special_id("<|media_begin|>"));
  want.push_back(tok.special_id("<|media_content|>"));
  want.insert(want.end(), 2, tok.special_id("<|media_pad|>"));
  want.push_back(tok.special_id("<|media_end|>"));
  ASSERT_LE(size_t(ids.end() - begin), ids.size());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), begin));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.special_id("<|media_pad|>")), 2);
}

TEST(VisionPrompt, MarkersPlaceImagesAndChatTurnsCarryThem) {
  const Tokenizer& tok = test::small_tokenizer();
  const std::vector<Image> images = {striped(7, 14, 1), striped(14, 14, 2)};
  const int32_t start = tok.special_id("<|image_start|>"), pad = tok.special_id("<|image_pad|>");
  std::vector<int32_t> ids = encode_with_images(tok, "see <image> here", {images.data(), 1}, 7, false);
  const std::vector<int32_t> see = tok.encode("see ");
  ASSERT_GT(ids.size(), see.size());
  EXPECT_TRUE(std::equal(see.begin(), see.end(), ids.begin()));
  EXPECT_EQ(ids[see.size()], start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), pad), 2);
  ids = encode_with_images(tok, "no marker", images, 7, false);  // both first, in order
  EXPECT_EQ(ids[0], start);
  EXPECT_EQ(ids[4], start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), pad), 6);
  EXPECT_THROW(encode_with_images(tok, "<image><image><image>", images, 7, false), Error);

  std::vector<ChatMessage> chat = {{"user", "What is it?", {}, {}, {}}};
  const ChatTemplate chat_template(tok);
  const std::vector<int32_t> plain = chat_template.encode(chat, true);
  EXPECT_EQ(plain, tok.encode(chat_template.apply(chat, true), true));
  chat[0].images.push_back({5, images[1]});  // after "What "
  const std::vector<int32_t> with = chat_template.encode(chat, true, {}, 7);
  EXPECT_EQ(with.size(), plain.size() + 6 + (tok.encode("user\nWhat ").size() + tok.encode("is it?").size() -
                                             tok.encode("user\nWhat is it?").size()));
  EXPECT_EQ(std::count(with.begin(), with.end(), pad), 4);
  EXPECT_EQ(chat_images(chat).size(), 1u);
}

TEST(VisionEval, ControlsKeepPixelsButNotLayout) {
  const Image img = striped(14, 21, 3);
  Rng rng(1);
  const Image shuffled = apply_control(img, ImageControl::ShuffledPatches, 7, rng);
  EXPECT_NE(shuffled.pixels, img.pixels);
  // The same six 7×7 patches, in another order.
  auto patches = [](const Image& im) {
    std::vector<std::string> out;
    for (int64_t pr = 0; pr < im.height / 7; ++pr)
      for (int64_t pc = 0; pc < im.width / 7; ++pc) {
        std::string p;
        for (int64_t y = 0; y < 7; ++y)
          for (int64_t x = 0; x < 7; ++x) p.push_back(char(im.pixels[size_t((pr * 7 + y) * im.width + pc * 7 + x)]));
        out.push_back(p);
      }
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(patches(shuffled), patches(img));
  const Image blank = apply_control(img, ImageControl::Blank, 7, rng);
  EXPECT_TRUE(std::all_of(blank.pixels.begin(), blank.pixels.end(), [](uint8_t v) { return v == 0; }));
  EXPECT_EQ(apply_control(img, ImageControl::None, 7, rng).pixels, img.pixels);
}

TEST(VisionEval, Base64AndWilsonIntervals) {
  for (const std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    const std::vector<uint8_t> back = base64_decode(base64_encode(s), "t");
    EXPECT_EQ(std::string(back.begin(), back.end()), s);
  }
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_THROW(base64_decode("Zm9", "t"), Error);
  EXPECT_THROW(base64_decode("Z===", "t"), Error);
  EXPECT_THROW(base64_decode("Zm8=Zm8=", "t"), Error);
  EXPECT_THROW(base64_decode("Zm-v", "t"), Error);
  const std::vector<uint8_t> wrapped = base64_decode("Zm9v\r\nYmFy", "t");
  EXPECT_EQ(std::string(wrapped.begin(), wrapped.end()), "foobar");
  // Reference values (Wilson score, z = 1.96).
  Interval i = wilson_interval(5, 10);
  EXPECT_NEAR(i.low, 0.2366, 1e-4);
  EXPECT_NEAR(i.high, 0.7634, 1e-4);
  i = wilson_interval(0, 10);
  EXPECT_EQ(i.low, 0);
  EXPECT_NEAR(i.high, 0.2775, 1e-4);
  i = wilson_interval(95, 100);
  EXPECT_NEAR(i.low, 0.8882, 1e-4);
  EXPECT_NEAR(i.high, 0.9785, 1e-4);
}

// `hyla train --images` mixes the records into every step and resumes exactly (the sampler's
// state is in the checkpoint); `hyla eval images` then reports the three runs, the confusion
// matrix, and an HTML report.
TEST(VisionTrain, TrainsWithImagesResumesExactlyAndEvaluates) {
  test::TinyRun& t = test::tiny();
  test::TempDir dir;
  const auto images = dir / "images";
  std::filesystem::create_directories(images);
  write_records(images / "train.bin", 64);
  write_records(images / "test.bin", 16, /*questions=*/false);  // classification: one answer per label
  test::write_bytes(images / "meta.json",
                    json{{"format", "hyla-image-records"}, {"version", 2}, {"classes", {"dark", "bright"}},
                         {"splits", {{"train", {{"file", "train.bin"}, {"records", 64}}},
                                     {"test", {{"file", "test.bin"}, {"records", 16}}}}}}.dump());
  json model = parse_json_file(t.config);
  model["vision"]["enabled"] = true;
  test::write_bytes(dir / "model.json", model.dump());
  json train = parse_json_file(t.train);
  train["images"] = {{"ratio", 1.0}};
  test::write_bytes(dir / "train.json", train.dump());
  const std::string args = "train --config " + (dir / "model.json").string() + " --train " + (dir / "train.json").string() +
                           " --data " + t.data + " --images " + images.string() + " --deterministic --quiet --out ";
  const std::string whole = (dir / "whole").string(), resumed = (dir / "resumed").string();
  auto r = test::run_hyla(args + whole);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("64 training records"), std::string::npos) << r.output;
  // A copy cut back to its earlier checkpoint continues as the whole run did.
  r = test::resume_copy_from_earlier_checkpoint(args, whole, resumed);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = test::metrics(whole), b = test::metrics(resumed);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].dump(), b[i]["loss"].dump()) << "step " << i + 1;

  r = test::run_hyla("eval images --model " + whole + "/model --images " + images.string() + " --out " +
                     (dir / "eval.json").string() + " --report " + (dir / "report.html").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json e = parse_json_file((dir / "eval.json").string());
  for (const char* run : {"images", "shuffled_patches", "blank"}) {
    ASSERT_TRUE(e["runs"].contains(run)) << e.dump();
    EXPECT_EQ(e["runs"][run]["samples"], 16);
    const json& confusion = e["runs"][run]["confusion"];  // two classes, one answer each; columns + "other"
    ASSERT_EQ(confusion.size(), 2u);
    for (const json& row : confusion) EXPECT_EQ(row[0].get<int>() + row[1].get<int>() + row[2].get<int>(), 8);
    EXPECT_LE(e["runs"][run]["ci95"][0].get<double>(), e["runs"][run]["accuracy"].get<double>());
  }
  std::ifstream html(dir / "report.html");
  const std::string page((std::istreambuf_iterator<char>(html)), {});
  EXPECT_NE(page.find("Confusion matrix"), std::string::npos);
  EXPECT_NE(page.find("data:image/png;base64,"), std::string::npos);

  // Bad combinations are one-line errors.
  r = test::run_hyla("train --config " + (dir / "model.json").string() + " --train " + (dir / "train.json").string() +
                     " --data " + t.data + " --out " + (dir / "x").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("pass --images DIR"), std::string::npos) << r.output;
  r = test::run_hyla("eval images --model " + whole + "/model --images " + (dir / "nowhere").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("meta.json"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hyla

namespace hyla {
namespace {

// `generate --image` and chat's `/image` read PNG files into the prompt; what a model cannot take
// is a one-line error naming the file (generate) or a bracketed note that lets the chat go on.
TEST(VisionCli, GenerateAndChatTakeImageFiles) {
  test::TempDir dir;
  const std::string model = (dir / "nano").string(), text_model = (dir / "text").string();
  test::small_tokenizer().save(dir / "tok.json");
  Model vision(test::nano_config([](json& j) {
    j["vocab_size"] = 512;
    j["vision"]["enabled"] = true;
  }));
  vision.initialize(3);
  vision.save(model, DType::F32, dir / "tok.json");
  Model text(test::nano_config([](json& j) { j["vocab_size"] = 512; }));
  text.initialize(3);
  text.save(text_model, DType::F32, dir / "tok.json");
  test::write_bytes(dir / "a.png", encode_png(striped(14, 14, 1)));
  test::write_bytes(dir / "wide.png", encode_png(striped(7, 70, 1)));
  test::write_bytes(dir / "bad.png", "not an image at all");

  // The CLI's text is the engine's for the same prompt and image.
  const std::string a = (dir / "a.png").string();
  const auto r = test::run_command("(" + std::string(HYLA_BINARY) + " generate -t 1 -m " + model +
                                   " -p 'Look: <image> now' --image " + a + " -n 5 --temperature 0 --dtype f32 2>/dev/null) > " +
                                   (dir / "out.txt").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string generated = read_file(dir / "out.txt");
  {
    const Tokenizer& tok = test::small_tokenizer();
    const Image img = to_model_image(read_image_file(a), vision.config().vision, a);
    GenerationRequest request;
    request.prompt = encode_with_images(tok, "Look: <image> now", {&img, 1}, 7, true);
    request.images = {img};
    request.max_tokens = 5;
    request.sampling.temperature = 0;
    EngineOptions o;
    o.max_sequences = 1;
    o.context = 64;
    o.precision = Precision::F32;
    o.prefix_cache_bytes = 0;
    Engine engine(vision, tok, o);
    EXPECT_EQ(generated, "Look: <image> now" + engine.submit(request).get().text + "\n");
  }
  auto error = [&](const std::string& args) {
    const auto e = test::run_hyla("generate -m " + args + " -n 2");
    EXPECT_NE(e.exit_code, 0) << args;
    return e.output;
  };
  EXPECT_NE(error(model + " -p x --image " + (dir / "bad.png").string()).find("bad.png: not a PNG or JPEG"), std::string::npos);
  EXPECT_NE(error(model + " -p x --image " + (dir / "wide.png").string()).find("vision.max_grid"), std::string::npos);
  EXPECT_NE(error(model + " -p '<image><image>' --image " + a).find("2 <image> markers but 1 image"), std::string::npos);
  EXPECT_NE(error(text_model + " -p x --image " + a).find("reads no images: it has no vision tower"), std::string::npos);

  test::write_bytes(dir / "in.txt", "/image " + a + "\nWhat is it?\n/image " + (dir / "bad.png").string() + "\n/exit\n");
  const auto chat = test::run_command(fmt::format("({} chat -t 1 -m {} -n 4 --temperature 0 --dtype f32 < {} > {} 2> {})",
                                                  HYLA_BINARY, model, (dir / "in.txt").string(), (dir / "chat.txt").string(),
                                                  (dir / "err.txt").string()));
  ASSERT_EQ(chat.exit_code, 0) << read_file(dir / "err.txt");
  const std::string err = read_file(dir / "err.txt"), out = read_file(dir / "chat.txt");
  EXPECT_NE(err.find("14x14, 6 positions"), std::string::npos) << err;
  EXPECT_NE(err.find("bad.png: not a PNG or JPEG"), std::string::npos) << err;
  size_t delimiters = 0;
  for (size_t at = out.find("<|im_end|>\n"); at != std::string::npos; at = out.find("<|im_end|>\n", at + 1)) ++delimiters;
  EXPECT_EQ(delimiters, 3u) << out;  // the two /image lines and the reply
}

}  // namespace
}  // namespace hyla
