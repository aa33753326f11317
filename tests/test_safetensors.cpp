#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "hyla/io/safetensors.h"
#include "test_util.h"

namespace hyla {
namespace {

using test::TempDir;

// A file from a raw header text and a data section.
std::string raw_file(const std::string& header, const std::string& data, int64_t declared_length = -1) {
  const uint64_t n = declared_length >= 0 ? uint64_t(declared_length) : header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// Expects opening `bytes` as a safetensors file to fail with a message containing `what` and
// naming the file, on a single line.
void expect_error(const std::string& bytes, const std::string& what) {
  TempDir dir;
  const auto path = dir / "bad.safetensors";
  test::write_bytes(path, bytes);
  try {
    SafetensorsFile file(path);
    FAIL() << "no error; expected: " << what;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(what), std::string::npos) << message;
    EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

Tensor filled(DType dtype, Shape shape, float start) {
  Tensor f = Tensor::empty(DType::F32, shape);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = start + float(i);
  return dtype == DType::F32 ? f : f.to(dtype);
}

TEST(Safetensors, RoundTripAllDtypesAligned) {
  TempDir dir;
  Tensor i8 = Tensor::empty(DType::I8, {3});
  for (int i = 0; i < 3; ++i) i8.data<int8_t>()[i] = int8_t(i - 1);
  Tensor i64 = Tensor::empty(DType::I64, {2});
  i64.data<int64_t>()[0] = -5;
  i64.data<int64_t>()[1] = 1ll << 40;
  NamedTensors tensors = {{"a.bf16", filled(DType::BF16, {3}, 1)}, {"b.i8", i8},
                          {"c.f32", filled(DType::F32, {2, 3}, 0.5f)}, {"d.f16", filled(DType::F16, {5}, -2)},
                          {"e.i64", i64}, {"empty", Tensor::zeros(DType::F32, {0, 4})}};
  save_safetensors(dir / "m.safetensors", tensors, {{"format", "pt"}});
  SafetensorsFile file(dir / "m.safetensors");
  EXPECT_EQ(file.header().metadata.at("format"), "pt");
  EXPECT_EQ(file.header().tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor got = file.get(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(got.raw(), t.raw(), t.nbytes()), 0) << name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.raw()) % dtype_size(t.dtype()), 0u) << name;
  }
  // The header is padded with spaces to a multiple of 8 and the data has no gaps.
  const std::string bytes = read_file(dir / "m.safetensors");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_THROW(file.get("nope"), Error);
  // No temporary files left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, ReadsOthersUnalignedFiles) {
  // A hand-built file whose F32 tensor starts at an odd offset (header not padded).
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  float v[2] = {1.5f, -2.0f};
  std::string data(8, '\0');
  std::memcpy(data.data(), v, 8);
  TempDir dir;
  test::write_bytes(dir / "u.safetensors", raw_file(header + "   ", data));  // 3 spaces: odd length
  SafetensorsFile file(dir / "u.safetensors");
  EXPECT_EQ(file.get("x").data<float>()[1], -2.0f);
}

const std::string kGood = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  const std::string d8(8, '\x01'), d16(16, '\x01');
  expect_error(std::string(5, '\0'), "fewer than the 8-byte header length");
  expect_error(raw_file(kGood, d8, 10000), "runs past the end of the file");
  expect_error(raw_file(kGood, d8, int64_t(200) << 20), "exceeds the 100 MB limit");
  expect_error(raw_file(R"({"a":{"dtype":"F32",)", ""), "not valid JSON");
  expect_error(raw_file("{\"a\xff\":1}", ""), "not valid UTF-8");
  expect_error(raw_file("[1,2]", ""), "not a JSON object");
  expect_error(raw_file(R"({"a":8e99999})", ""), "not valid JSON");  // found by the fuzzer: number overflow
  expect_error(raw_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", d8), "unknown dtype 'F64'");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8), "needs 12 bytes");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        std::string(12, '\1')),
               "overlaps");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                        std::string(12, '\1')),
               "not contiguous");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8), "not contiguous");
  expect_error(raw_file(kGood, std::string(4, '\1')), "truncated");
  expect_error(raw_file(kGood, d16), "8 trailing bytes");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                        d8),
               "duplicate key 'a'");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), "invalid shape entry");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8), "begin after end");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8), "data_offsets");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", d8), "unknown field 'x'");
  expect_error(raw_file(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8),
               "__metadata__['k'] is not a string");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,2],"data_offsets":[0,8]}})", d8), "at most 4");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", d8),
               "needs too many bytes");
}

TEST(Safetensors, ShardedModelWeights) {
  TempDir dir;
  NamedTensors tensors;
  for (int i = 0; i < 5; ++i) tensors.emplace_back("t" + std::to_string(i), filled(DType::F32, {256}, float(i)));
  save_model_weights(dir.path(), tensors, /*max_shard_bytes=*/2048);
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00003-of-00003.safetensors"));
  ModelWeights weights(dir.path());
  EXPECT_EQ(weights.names().size(), 5u);
  EXPECT_EQ(weights.files().size(), 3u);
  EXPECT_EQ(weights.get("t4").data<float>()[255], 4.0f + 255.0f);

  // An index naming a tensor its shard lacks is an error naming both.
  test::write_bytes(dir / "model.safetensors.index.json",
                    R"({"weight_map":{"t0":"model-00001-of-00003.safetensors","zz":"model-00001-of-00003.safetensors"}})");
  try {
    ModelWeights bad(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'zz'"), std::string::npos) << e.what();
  }
  // Back to a single file: the index goes away.
  save_model_weights(dir.path(), tensors);
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(ModelWeights(dir.path()).files().size(), 1u);

  // From ModelWeights, a tensor at a time, converted to bf16 (1 KB of f32 each: 512 B): the same
  // shards at half the limit, and each tensor read once.
  ModelWeights lazy;
  int reads = 0;
  for (const auto& [name, t] : tensors)
    lazy.add({name, DType::F32, t.shape(), 0, uint64_t(t.nbytes())}, "lazy", [&reads, t] { return ++reads, t; });
  TempDir streamed;
  save_model_weights(streamed.path(), lazy, DType::BF16, /*max_shard_bytes=*/1024);
  EXPECT_EQ(reads, 5);
  EXPECT_TRUE(std::filesystem::exists(streamed / "model-00003-of-00003.safetensors"));
  ModelWeights back(streamed.path());
  EXPECT_EQ(back.files().size(), 3u);
  EXPECT_EQ(back.entry("t4").dtype, DType::BF16);
  EXPECT_EQ(back.get("t4").to(DType::F32).data<float>()[12], 4.0f + 12.0f);  // exact in bf16
}

TEST(Safetensors, FailedWriteLeavesNoFile) {
  TempDir dir;
  NamedTensors dup = {{"a", filled(DType::F32, {2}, 0)}, {"a", filled(DType::F32, {2}, 0)}};
  EXPECT_THROW(save_safetensors(dir / "x.safetensors", dup), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace hyla
