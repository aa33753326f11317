// GGUF: the container (metadata of every type, tensors of every type hyla reads, bad files), the
// block codecs against plain arithmetic, and Kimi K3 / Kimi Linear models written as llama.cpp GGUF
// and read back with the same logits (model/kimi_gguf.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <sys/stat.h>

#include "hyla/core/half.h"
#include "hyla/io/gguf.h"
#include "hyla/data/gguf_vocab.h"
#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tiktoken.h"
#include "hyla/io/base64.h"
#include "hyla/io/json_fields.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/model/expert_offload.h"
#include "hyla/model/arch/architecture.h"
#include "hyla/model/gguf_model.h"
#include "hyla/model/mxfp4_weights.h"
#include "hyla/model/model.h"
#include "hyla/model/model_files.h"
#include "model_test_util.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A file with one tensor per type hyla reads and metadata of every value type.
void write_sample(const fs::path& path, const std::vector<float>& values) {
  GgufMetadata meta;
  meta["general.architecture"] = GgufValue::string("test");
  meta["a.u32"] = GgufValue::u32(7);
  meta["a.f32"] = GgufValue::f32(0.5f);
  meta["a.bool"] = GgufValue::boolean(true);
  meta["a.array"] = GgufValue::of_array(GgufValueType::I32, {0, -1, 2});
  meta["a.strings"] = GgufValue::of_array(GgufValueType::String, {"x", "yz"});
  meta["a.u8"] = {GgufValueType::U8, 200};
  meta["a.i64"] = {GgufValueType::I64, -5};
  meta["a.f64"] = {GgufValueType::F64, 0.25};
  std::vector<GgufTensor> tensors;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0})
    tensors.push_back({"t." + ggml_type_name(uint32_t(t)), {64, 2}, uint32_t(t), 0, 0});
  GgufWriter writer(path, meta, tensors);
  for (const GgufTensor& t : writer.tensors()) {
    std::vector<uint8_t> bytes(t.bytes);
    f32_to_ggml(GgmlType(t.type), values.data(), bytes.data(), 128);
    writer.write(bytes.data(), 10);  // in two parts
    writer.write(bytes.data() + 10, bytes.size() - 10);
  }
  writer.commit();
}

TEST(Gguf, WritesAndReadsEveryTypeAndValue) {
  TempDir dir;
  const std::vector<float> values = test::normal_floats(128, 1);
  write_sample(dir / "a.gguf", values);
  const GgufFile g(dir / "a.gguf");
  EXPECT_EQ(g.string("general.architecture"), "test");
  EXPECT_EQ(g.integer("a.u32"), 7);
  EXPECT_EQ(g.number("a.f32"), 0.5);
  EXPECT_TRUE(g.boolean("a.bool"));
  EXPECT_EQ(g.integers("a.array"), (std::vector<int64_t>{0, -1, 2}));
  EXPECT_EQ(g.integer("a.u8"), 200);
  EXPECT_EQ(g.integer("a.i64"), -5);
  EXPECT_EQ(g.number("a.f64"), 0.25);
  EXPECT_EQ(g.metadata().at("a.strings").array, GgufArray(GgufValueType::String, {"x", "yz"}));
  EXPECT_EQ(g.metadata().at("a.strings").array.string(1), "yz");
  ASSERT_EQ(g.tensors().size(), 4u);
  for (const GgufTensor& t : g.tensors()) {
    EXPECT_EQ(t.shape(), (Shape{2, 64})) << t.name;
    EXPECT_EQ(t.offset % kGgufAlignment, 0u);
    const Tensor x = g.to_f32(t);
    for (int64_t i = 0; i < 128; ++i) {
      const float v = values[size_t(i)];
      float expected = v;
      if (t.type == uint32_t(GgmlType::F16)) expected = to_f32(to_f16(v));
      if (t.type == uint32_t(GgmlType::BF16)) expected = to_f32(to_bf16(v));
      if (t.type == uint32_t(GgmlType::Q8_0)) {  // within half a step of the block's scale
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(values[size_t(i / 32 * 32 + j)]));
        // half a step, plus the f16 rounding of the step times 127
        EXPECT_NEAR(x.data<float>()[i], v, amax / 127 * 0.6 + 1e-6) << t.name << " " << i;
        continue;
      }
      EXPECT_EQ(x.data<float>()[i], expected) << t.name << " " << i;
    }
  }
  EXPECT_THROW(g.integer("a.missing"), Error);
  test::expect_error([&] { g.integer("a.f32"); }, "'a.f32'");
}

TEST(Gguf, Q8_0MatchesGgmlReference) {
  // ggml's quantize_row_q8_0_ref: d = amax / 127 stored as f16, q = round(x / d) with d in f32.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[size_t(j)] = float(j - 10) * 0.37f;
  uint8_t block[34];
  quantize_q8_0(x.data(), block, 32);
  f16 d;
  std::memcpy(&d, block, 2);
  const float scale = 21 * 0.37f / 127;
  EXPECT_EQ(d.bits, to_f16(scale).bits);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(int8_t(block[2 + j]), int8_t(std::round(x[size_t(j)] / scale))) << j;
  std::vector<float> back(32);
  ggml_to_f32(GgmlType::Q8_0, block, back.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(back[size_t(j)], float(int8_t(block[2 + j])) * to_f32(d));
}

TEST(Gguf, Mxfp4DecodesE2M1WithE8M0Scale) {
  // One block: scale byte 127 (2^0), code j in the low nibble of byte j, code 15 − j in the high one.
  uint8_t block[17];
  block[0] = 127;
  for (int j = 0; j < 16; ++j) block[1 + j] = uint8_t(j | ((15 - j) << 4));
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  std::vector<float> out(32);
  ggml_to_f32(GgmlType::MXFP4, block, out.data(), 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[size_t(j)], e2m1[j]) << j;
    EXPECT_EQ(out[size_t(16 + j)], e2m1[15 - j]) << j;
  }
  block[0] = 130;  // 2^3
  ggml_to_f32(GgmlType::MXFP4, block, out.data(), 32);
  EXPECT_EQ(out[7], 48.0f);
}

TEST(Gguf, Mxfp4BlocksAndCodesConvertLosslessly) {
  // ggml's blocks → codes two a byte in order → blocks: the same bytes, and the same values.
  std::mt19937 rng(4);
  std::vector<uint8_t> blocks(17 * 6);
  for (uint8_t& b : blocks) b = uint8_t(rng());
  for (int b = 0; b < 6; ++b) blocks[size_t(17 * b)] = uint8_t(100 + 7 * b);
  std::vector<uint8_t> codes(16 * 6), scales(6), back(blocks.size());
  mxfp4_blocks_to_codes(blocks.data(), 32 * 6, codes.data(), scales.data());
  mxfp4_codes_to_blocks(codes.data(), scales.data(), 32 * 6, back.data());
  EXPECT_EQ(back, blocks);
  std::vector<float> values(32 * 6);
  ggml_to_f32(GgmlType::MXFP4, blocks.data(), values.data(), 32 * 6);
  for (int i = 0; i < 32 * 6; ++i) {
    const uint8_t byte = codes[size_t(i / 2)];
    ASSERT_EQ(values[size_t(i)], mxfp4_value(i % 2 ? byte >> 4 : byte & 15, scales[size_t(i / 32)])) << i;
  }
}

TEST(Gguf, BadFilesNameTheProblem) {
  TempDir dir;
  write_sample(dir / "good.gguf", test::normal_floats(128, 2));
  const std::string good = read_all(dir / "good.gguf");
  auto expect_bad = [&](const std::string& bytes, const std::string& what) {
    test::write_bytes(dir / "bad.gguf", bytes);
    test::expect_error([&] { GgufFile g(dir / "bad.gguf"); }, what);
    test::expect_error([&] { GgufFile g(dir / "bad.gguf"); }, "bad.gguf");
  };
  expect_bad("GGUF", "truncated");
  expect_bad("GGML" + good.substr(4), "not a GGUF file");
  expect_bad(good.substr(0, 100), "truncated");
  expect_bad(good.substr(0, good.size() - kGgufAlignment), "truncated: tensor 't.Q8_0'");
  std::string v2 = good;
  v2[4] = 2;
  expect_bad(v2, "version 2");
  // Tensor t.F32's type field (after its name, dimension count and two dimensions) set to Q4_K.
  std::string q4 = good;
  const size_t name = q4.find("t.F32");
  const uint32_t q4_k = 12;
  std::memcpy(q4.data() + name + 5 + 4 + 16, &q4_k, 4);
  expect_bad(q4, "tensor 't.F32' is Q4_K");
  std::string misaligned = good;
  const uint64_t offset = 3;
  std::memcpy(misaligned.data() + name + 5 + 4 + 16 + 4, &offset, 8);
  expect_bad(misaligned, "not a multiple of the alignment");
  test::expect_error([] { ggml_type_from_name("q4_k"); }, "'q4_k'");
}

// A GGUF header with one metadata array and no tensors, written by hand: `count` elements of
// `element`, whose bytes are `body`.
std::string array_file(uint32_t element, uint64_t count, const std::string& body) {
  std::string f = "GGUF";
  auto put = [&](auto v) { f.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint32_t(3));
  put(uint64_t(0));  // tensors
  put(uint64_t(1));  // metadata
  put(uint64_t(5));
  f += "a.arr";
  put(uint32_t(GgufValueType::Array));
  put(element);
  put(count);
  f += body;
  return f + std::string((32 - f.size() % 32) % 32, '\0');  // the (empty) data section starts aligned
}

int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

// Arrays cost their size in the file, not a JSON value per element; a count larger than the file
// can hold is refused before anything is read.
TEST(Gguf, MetadataArraysCostTheirBytesAndLyingCountsNothing) {
  TempDir dir;
  const uint64_t n = uint64_t(16) << 20;
  test::write_bytes(dir / "bools.gguf", array_file(uint32_t(GgufValueType::Bool), n, std::string(n, '\1')));
  const int64_t before = resident_bytes();
  const auto start = std::chrono::steady_clock::now();
  {
    const GgufFile g(dir / "bools.gguf");
    EXPECT_EQ(g.metadata().at("a.arr").array.size(), n);
    EXPECT_EQ(g.metadata().at("a.arr").array.at(n - 1), true);
    // The map's pages and one copy, with room to spare; ~50x the size as JSON values.
    EXPECT_LT(resident_bytes() - before, int64_t(3 * n));
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  std::string strings;
  for (const char* s : {"ab", "", "cde"}) {
    const uint64_t len = std::strlen(s);
    strings.append(reinterpret_cast<const char*>(&len), 8);
    strings += s;
  }
  test::write_bytes(dir / "strings.gguf", array_file(uint32_t(GgufValueType::String), 3, strings));
  const GgufFile g(dir / "strings.gguf");
  EXPECT_EQ(g.metadata().at("a.arr").array.string(2), "cde");
  EXPECT_EQ(g.metadata().at("a.arr").array.string(1), "");
  test::expect_error([&] { g.integers("a.arr"); }, "'a.arr' is an array of string, not of integers");
  for (uint32_t element : {uint32_t(GgufValueType::U8), uint32_t(GgufValueType::F64), uint32_t(GgufValueType::String)}) {
    test::write_bytes(dir / "lie.gguf", array_file(element, uint64_t(1) << 60, std::string(64, '\0')));
    test::expect_error([&] { GgufFile lie(dir / "lie.gguf"); }, "truncated");
  }
  test::write_bytes(dir / "bool2.gguf", array_file(uint32_t(GgufValueType::Bool), 3, std::string("\1\0\2", 3)));
  test::expect_error([&] { GgufFile b(dir / "bool2.gguf"); }, "element 2 is a bool holding 2");
}

// Logits of `model` over a fixed sequence.
Tensor logits_of(Model& model) {
  ModelInput in;
  for (int i = 0; i < 40; ++i) in.ids.push_back(int32_t((i * 37 + 11) % model.config().vocab_size));
  in.tokens = TokenBatch::uniform(1, int64_t(in.ids.size()));
  return model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// A tiny Kimi-shaped model with random weights everywhere (AttnRes queries, norms, biases), saved.
ModelConfig save_random(const std::string& config_file, const fs::path& dir) {
  const ModelConfig config = model_config_of((test::source_dir() / config_file).string());
  Model model(config);
  model.initialize(1);
  test::randomize_params(model.params(), 5);
  model.save(dir, DType::F32);
  return config;
}

TEST(KimiGguf, RoundTripKeepsTheLogits) {
  for (const auto& [file, arch] : {std::pair{"configs/kimi-k3-tiny.json", "kimi-k3"},
                                   std::pair{"configs/kimi-linear-tiny.json", "kimi-linear"}}) {
    TempDir dir;
    const ModelConfig config = save_random(file, dir / "model");
    const auto original = Model::load(dir / "model");
    const Tensor want = logits_of(*original);
    EXPECT_EQ(save_gguf(dir / "m.gguf", config, ModelWeights(dir / "model"), {}).arch, arch);
    ASSERT_TRUE(is_gguf_file(dir / "m.gguf"));
    const auto gguf = std::make_shared<const GgufFile>(dir / "m.gguf");
    EXPECT_EQ(gguf->string("general.architecture"), arch);
    // The config the GGUF carries is the one written (up to what GGUF does not store: training settings).
    const ModelConfig read = config_from_gguf(*gguf);
    nlohmann::json a = config.to_json(), b = read.to_json();
    for (auto* j : {&a, &b}) {
      (*j)["kda"].erase("chunk_size");
      (*j).erase("initializer_range");
      for (const char* k : {"balancing", "bias_update_speed", "aux_loss_coef"}) (*j)["moe"].erase(k);
      (*j)["rms_norm_eps"] = float((*j)["rms_norm_eps"].get<double>());
      (*j)["mla"]["norm_eps"] = float((*j)["mla"]["norm_eps"].get<double>());
      (*j)["moe"]["routed_scaling_factor"] = float((*j)["moe"]["routed_scaling_factor"].get<double>());
    }
    EXPECT_EQ(a.dump(1), b.dump(1)) << arch;
    // A_log and the AttnRes scores go through −exp and a product: logits agree to rounding.
    const auto loaded = Model::load(dir / "m.gguf");
    EXPECT_LT(max_abs_difference(logits_of(*loaded), want), 1e-5) << arch;

    // bf16 and Q8_0 matrices hold the weights rounded as those types round them; the rest stays f32.
    for (GgmlType type : {GgmlType::BF16, GgmlType::Q8_0}) {
      save_gguf(dir / "q.gguf", config, ModelWeights(dir / "model"), {.matrices = type});
      const GgufFile q(dir / "q.gguf");
      EXPECT_EQ(q.tensor("blk.0.attn_output.weight").type, uint32_t(type));
      EXPECT_EQ(q.tensor("blk.0.attn_norm.weight").type, uint32_t(GgmlType::F32));
      // Q8_0 matrices stay int8 (codes and f16 scales as hyla's int8 with block 32); f_b_proj, whose
      // rows of 16 are not whole Q8_0 blocks, was written F32 and stays float.
      const auto rounded = Model::load(dir / "q.gguf");
      const ModelWeights stored = weights_from_gguf(std::make_shared<const GgufFile>(dir / "q.gguf"), config);
      const bool int8 = type == GgmlType::Q8_0;
      if (int8) {  // decoded instead (hyla logits --dtype f32): the same values in f32
        const ModelWeights decoded = weights_from_gguf(std::make_shared<const GgufFile>(dir / "q.gguf"), config, GgufQuantized::Decoded);
        const std::string name = "model.layers.1.self_attn.q_proj.weight";
        const Tensor codes = stored.get(name), scales = stored.get(name + ".scale"), values = decoded.get(name);
        ASSERT_EQ(values.dtype(), DType::F32);
        for (int64_t i = 0; i < codes.numel(); ++i)
          ASSERT_EQ(values.data<float>()[i], float(codes.data<int8_t>()[i]) * scales.data<float>()[i / 32]) << i;
        EXPECT_FALSE(Model::load(dir / "q.gguf", {.decode_quantized = true})->params().get(name).is_int8());
      }
      EXPECT_EQ(rounded->params().get("model.layers.2.mlp.experts.3.down_proj.weight").is_int8(), int8);
      EXPECT_EQ(rounded->params().get("model.layers.1.mlp.shared_experts.up_proj.weight").is_int8(), int8);
      EXPECT_EQ(rounded->params().get("model.layers.1.self_attn.q_proj.weight").is_int8(), int8);
      EXPECT_FALSE(rounded->params().get("model.layers.1.self_attn.f_b_proj.weight").is_int8());
      for (const char* name : {"model.layers.1.self_attn.q_proj.weight", "model.layers.2.mlp.experts.3.down_proj.weight",
                               "model.layers.0.post_attention_layernorm.weight"}) {
        const Param& a = original->params().get(name);
        const bool matrix = a.shape.ndim() == 2;
        Tensor b = stored.get(name);
        if (b.dtype() == DType::I8) {  // decode the codes with their scales
          const Tensor scales = stored.get(std::string(name) + ".scale");
          Tensor f = Tensor::empty(DType::F32, b.shape());
          for (int64_t i = 0; i < b.numel(); ++i) f.data<float>()[i] = float(b.data<int8_t>()[i]) * scales.data<float>()[i / 32];
          b = f;
        }
        b = b.dtype() == DType::F32 ? b : b.to(DType::F32);
        for (int64_t i = 0; i < a.numel(); ++i) {
          const float x = a.value.data<float>()[i], y = b.data<float>()[i];
          if (!matrix) {
            ASSERT_EQ(y, x) << name;
          } else if (type == GgmlType::BF16) {
            ASSERT_EQ(y, to_f32(to_bf16(x))) << name << " " << i;
          } else {
            const int64_t row = a.shape[1], first = i / 32 * 32;
            ASSERT_EQ(row % 32, 0);
            float amax = 0;
            for (int64_t j = first; j < first + 32; ++j) amax = std::max(amax, std::fabs(a.value.data<float>()[j]));
            ASSERT_NEAR(y, x, amax / 127 * 0.6 + 1e-7) << name << " " << i;
          }
        }
      }
    }

    // GGUF back to a model directory: the same tensors, the same logits.
    const test::CommandResult r = test::run_hyla(fmt::format("convert -m {} --out {}", (dir / "m.gguf").string(),
                                                            (dir / "back").string()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(max_abs_difference(logits_of(*Model::load(dir / "back")), logits_of(*loaded)), 0) << arch;
  }
}

// The tensor count in a GGUF file's header (bytes 8-15).
uint64_t header_tensor_count(const fs::path& path) {
  const std::string bytes = read_all(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + 8, 8);
  return n;
}

TEST(KimiGguf, SplitSetsReadAsOneFileFromAnyShard) {
  TempDir dir;
  const ModelConfig config = save_random("configs/kimi-k3-tiny.json", dir / "model");
  const ModelWeights weights(dir / "model");
  save_gguf(dir / "one.gguf", config, weights, {.matrices = GgmlType::Q8_0});
  const GgufExport split =
      save_gguf(dir / "set.gguf", config, weights, {.matrices = GgmlType::Q8_0, .split_max_bytes = 48 << 10});
  const int count = int(split.files.size());
  ASSERT_GE(count, 4);
  EXPECT_FALSE(fs::exists(dir / "set.gguf"));
  for (int i = 0; i < count; ++i) EXPECT_EQ(split.files[size_t(i)], gguf_shard_path(dir / "set", i, count));
  // As the published sets: the first shard holds the metadata and no tensors.
  EXPECT_EQ(header_tensor_count(split.files[0]), 0u);
  const GgufFile one(dir / "one.gguf"), set(split.files[2]);
  EXPECT_EQ(set.path(), split.files[0]);
  EXPECT_EQ(set.shard_count(), size_t(count));
  EXPECT_EQ(set.tensors().size(), one.tensors().size());
  EXPECT_EQ(set.string("general.architecture"), "kimi-k3");
  for (const GgufTensor& t : set.tensors()) {
    EXPECT_GE(t.shard, 1u);
    const GgufTensor& u = one.tensor(t.name);
    ASSERT_EQ(t.bytes, u.bytes) << t.name;
    EXPECT_EQ(std::memcmp(set.data(t), one.data(u), t.bytes), 0) << t.name;
    EXPECT_EQ(set.path_of(t), split.files[t.shard]);
  }

  // Any shard names the set; resident and with offloaded experts, the logits are the single file's.
  const Tensor want = logits_of(*Model::load(dir / "one.gguf"));
  for (int i : {0, 1, count - 1})
    EXPECT_EQ(max_abs_difference(logits_of(*Model::load(split.files[size_t(i)])), want), 0) << "shard " << i + 1;
  const auto offloaded =
      Model::load(split.files[1], {.offload_experts = ExpertOffloadOptions{parse_expert_memory("50%")}});
  EXPECT_EQ(max_abs_difference(logits_of(*offloaded), want), 0);
  const test::CommandResult inspect = test::run_hyla("inspect " + split.files[0].string());
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find(fmt::format("a split set of {} shards", count)), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("Q8_0"), std::string::npos);
  const test::CommandResult plan = test::run_hyla("plan --config " + split.files[2].string());
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  // `convert --split-max-size` writes the same set.
  const test::CommandResult convert = test::run_hyla(fmt::format(
      "convert -m {} --out {} --type q8_0 --split-max-size 48K", (dir / "model").string(), (dir / "cli.gguf").string()));
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  EXPECT_EQ(read_all(gguf_shard_path(dir / "cli", 2, count)), read_all(split.files[2]));

  // A missing shard, a shard of another set in its place, and a leftover of another split: each
  // an error naming the file.
  const fs::path third = split.files[2];
  fs::rename(third, dir / "aside.gguf");
  test::expect_error([&] { GgufFile g(split.files[0]); }, third.filename().string() + ": shard 3 of " +
                                                                   std::to_string(count) + " of this split GGUF is missing");
  fs::copy_file(split.files[3], third);
  test::expect_error([&] { GgufFile g(split.files[1]); }, third.filename().string() + ": not shard 3 of this set");
  fs::remove(third);
  fs::rename(dir / "aside.gguf", third);
  GgufFile ok(split.files[0]);
  const fs::path stray = gguf_shard_path(dir / "set", 0, count + 1);
  fs::copy_file(split.files[0], stray);
  test::expect_error([&] { GgufFile g(split.files[0]); }, stray.filename().string() + ": a shard of another split");
  // A shard whose name does not say its place.
  fs::copy_file(split.files[1], dir / "renamed.gguf");
  test::expect_error([&] { GgufFile g(dir / "renamed.gguf"); }, "not named PREFIX-00002-of-");
}

// A GGUF written byte by byte (hyla's writer writes only the types it produces, and no lies).
struct RawTensor {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
};
std::string raw_gguf(const std::vector<RawTensor>& tensors, const std::string& data) {
  std::string out;
  auto put = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint32_t(0x46554747)), put(uint32_t(3)), put(uint64_t(tensors.size())), put(uint64_t(0));
  for (const RawTensor& t : tensors) {
    put(uint64_t(t.name.size()));
    out += t.name;
    put(uint32_t(t.ne.size()));
    for (uint64_t n : t.ne) put(n);
    put(t.type), put(t.offset);
  }
  out.append((32 - out.size() % 32) % 32, '\0');
  return out + data;
}
std::string raw_gguf(uint32_t type, uint64_t ne0, const std::string& data) {
  return raw_gguf({{"blk.0.ffn_down_exps.weight", {ne0}, type, 0}}, data);
}

TEST(Gguf, SizesThatWrapAndTensorsThatOverlapAreRefused) {
  TempDir dir;
  // F32 [256, 2^54]: 2^62 values of 4 bytes wrap to 0 bytes in 64 bits.
  test::write_bytes(dir / "wrap.gguf", raw_gguf({{"t", {256, uint64_t(1) << 54}, 0, 0}}, std::string(64, '\0')));
  test::expect_error([&] { GgufFile g(dir / "wrap.gguf"); }, "wrap.gguf: tensor 't' (F32, ne [256, 18014398509481984]) would need");
  // Two tensors on the same bytes, and two that overlap by one block.
  const std::string data(256, '\0');
  test::write_bytes(dir / "alias.gguf", raw_gguf({{"a", {32}, 0, 0}, {"b", {32}, 0, 0}}, data));
  test::expect_error([&] { GgufFile g(dir / "alias.gguf"); }, "alias.gguf: tensors 'a' [0, 128) and 'b' [0, 128) overlap");
  test::write_bytes(dir / "overlap.gguf", raw_gguf({{"a", {64}, 0, 0}, {"b", {32}, 0, 128}}, data + data));
  test::expect_error([&] { GgufFile g(dir / "overlap.gguf"); }, "tensors 'a' [0, 256) and 'b' [128, 256) overlap");
  test::write_bytes(dir / "apart.gguf", raw_gguf({{"a", {32}, 0, 0}, {"b", {32}, 0, 128}}, data));
  EXPECT_EQ(GgufFile(dir / "apart.gguf").tensors().size(), 2u);
}

TEST(Gguf, QuantisedTensorsThatCannotBeReadNameFileTensorAndType) {
  TempDir dir;
  // A Q4_K block (144 bytes) whose scale d is a NaN: every value of the block is NaN.
  std::string block(144, '\x11');
  block[0] = '\x00', block[1] = '\x7e';
  test::write_bytes(dir / "nan.gguf", raw_gguf(12, 256, block));
  const GgufFile nan(dir / "nan.gguf");
  test::expect_error([&] { nan.to_f32(nan.tensors().at(0)); },
                     "nan.gguf: tensor 'blk.0.ffn_down_exps.weight' (Q4_K): block 0 decodes to nan");
  // The same block with a finite scale reads.
  block[1] = '\x3c';
  test::write_bytes(dir / "ok.gguf", raw_gguf(12, 256, block));
  const GgufFile ok(dir / "ok.gguf");
  EXPECT_EQ(ok.to_f32(ok.tensors().at(0)).numel(), 256);
  // Truncated: half the block.
  test::write_bytes(dir / "cut.gguf", raw_gguf(12, 256, block.substr(0, 72)));
  test::expect_error([&] { GgufFile g(dir / "cut.gguf"); },
                     "cut.gguf: truncated: tensor 'blk.0.ffn_down_exps.weight' (Q4_K) needs bytes [0, 144)");
  // A type hyla does not read (Q8_K is an activation type; 99 is none).
  for (const auto& [type, name] : {std::pair{15u, "Q8_K"}, std::pair{99u, "type 99"}}) {
    test::write_bytes(dir / "type.gguf", raw_gguf(type, 256, block));
    test::expect_error([&] { GgufFile g(dir / "type.gguf"); },
                       std::string("type.gguf: tensor 'blk.0.ffn_down_exps.weight' is ") + name + ", a ggml type hyla does not read");
  }
}

// `from` rewritten with every matrix llama-quantize would quantise (2-D and 3-D weights but the
// embedding, norms, convs, the router and A_log) as random blocks of the 32-value types in turn,
// their values below 0.05 in magnitude; the rest as it was.
void write_quantised_copy(const GgufFile& from, const fs::path& to, uint64_t seed) {
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::Q4_1, GgmlType::Q5_0,
                            GgmlType::Q8_0};
  std::mt19937_64 random(seed);
  std::vector<GgufTensor> tensors = from.tensors();
  std::vector<std::string> data;
  size_t next = 0;
  for (GgufTensor& t : tensors) {
    const bool matrix = t.ne.size() >= 2 && t.ne[1] > 1 && t.ne[0] % 32 == 0 && t.name != "token_embd.weight" &&
                        t.name.find("norm") == std::string::npos && t.name.find("conv") == std::string::npos &&
                        t.name.find("_inp") == std::string::npos && t.name.find("ssm_a") == std::string::npos;
    if (!matrix) {
      data.emplace_back(reinterpret_cast<const char*>(from.data(t)), t.bytes);
      continue;
    }
    const GgmlType type = types[next++ % std::size(types)];
    t.type = uint32_t(type);
    t.bytes = ggml_bytes(type, t.numel());
    std::string bytes(t.bytes, '\0');
    const int64_t bb = ggml_block_bytes(type), bv = ggml_block_values(type);
    float values[32];
    for (int64_t b = 0; b < t.numel() / bv; ++b) {
      auto* block = reinterpret_cast<uint8_t*>(bytes.data()) + b * bb;
      do {
        for (int64_t i = 0; i < bb; ++i) block[i] = uint8_t(random());
        if (type == GgmlType::Q8_0) block[1] &= 0x7f;  // as ggml writes them (hyla's int8 needs scales >= 0)
        ggml_to_f32(type, block, values, bv);
      } while (!std::all_of(values, values + bv, [](float v) { return std::isfinite(v) && std::fabs(v) < 0.05f; }));
    }
    data.push_back(std::move(bytes));
  }
  GgufWriter out(to, from.metadata(), tensors);
  for (const std::string& d : data) out.write(d.data(), d.size());
  out.commit();
}

// The file whose memory map holds `address` (/proc/self/maps), or "".
std::string mapped_file_of(const void* address) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> begin >> dash >> end;
    if (uintptr_t(address) < begin || uintptr_t(address) >= end) continue;
    const size_t slash = line.find('/');
    return slash == std::string::npos ? "" : line.substr(slash);
  }
  return "";
}

TEST(KimiGguf, QuantisedMatricesAreMultipliedWhereTheyLieInTheMap) {
  TempDir dir;
  const ModelConfig config = save_random("configs/kimi-k3-tiny.json", dir / "model");
  save_gguf(dir / "m.gguf", config, ModelWeights(dir / "model"), {});
  write_quantised_copy(GgufFile(dir / "m.gguf"), dir / "q.gguf", 3);
  const auto in_place = Model::load(dir / "q.gguf");
  const auto decoded = Model::load(dir / "q.gguf", {.decode_quantized = true});
  const GgufFile q(dir / "q.gguf");
  int blocks = 0;
  for (const auto& p : in_place->params().params()) {
    if (!p->is_ggml()) continue;
    blocks += 1;
    // No copy: the blocks the products read lie in a memory map of the file itself.
    EXPECT_TRUE(mapped_file_of(p->ggml.data).ends_with("/q.gguf")) << p->name << " " << mapped_file_of(p->ggml.data);
    EXPECT_FALSE(decoded->params().get(p->name).is_quantized()) << p->name;
  }
  EXPECT_TRUE(in_place->params().get("model.layers.1.mlp.experts.3.down_proj.weight").is_ggml());
  EXPECT_TRUE(in_place->params().get("model.layers.1.self_attn.q_proj.weight").is_ggml());
  EXPECT_FALSE(in_place->params().get("model.layers.0.input_layernorm.weight").is_quantized());
  EXPECT_GT(blocks, 20);
  // Each matrix multiplies as its decoded f32 copy does, up to the rounding of x to 8 bits per 16
  // values (s_x = max|x| / 127 ≤ 1/127 here, so each x moves by at most 1/254).
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const auto& p : in_place->params().params()) {
    if (!p->is_ggml()) continue;
    const int64_t n = 3, out = p->shape[0], in = p->shape[1];
    std::vector<float> x(size_t(n * in)), got(size_t(n * out)), want(size_t(n * out));
    for (float& v : x) v = uniform(random);
    Linear::over(*p).forward(x.data(), n, got.data(), Precision::BF16);
    Param& f = decoded->params().get(p->name);
    Linear::over(f).forward(x.data(), n, want.data(), Precision::F32);
    for (int64_t r = 0; r < out; ++r) {
      double bound = 1e-6;
      for (int64_t c = 0; c < in; ++c) bound += std::fabs(double(f.value.data<float>()[r * in + c])) / 254.0;
      for (int64_t j = 0; j < n; ++j) ASSERT_NEAR(got[size_t(j * out + r)], want[size_t(j * out + r)], bound) << p->name;
    }
  }
  // A tiny random model amplifies that rounding: hyla's int8 products of an all-Q8_0 copy of this
  // file move the logits by 0.14 of the largest (0.75) too. Finite, and of that order:
  const Tensor exact = logits_of(*decoded), fast = logits_of(*in_place);
  double largest = 0;
  for (int64_t i = 0; i < exact.numel(); ++i) largest = std::max(largest, double(std::fabs(exact.data<float>()[i])));
  EXPECT_GT(largest, 0.1);
  EXPECT_LT(max_abs_difference(fast, exact), 0.3 * largest);
  // Offloaded experts are the same blocks, paged in rather than copied: the same logits, bit for bit.
  for (const char* memory : {"40%", "100%"}) {
    const auto offloaded = Model::load(
        dir / "q.gguf", {.offload_experts = ExpertOffloadOptions{.memory = parse_expert_memory(memory)}});
    EXPECT_EQ(max_abs_difference(logits_of(*offloaded), fast), 0) << memory;
  }
  // A block whose scale is not finite is an error naming the file, tensor, type and block, resident or offloaded.
  {
    std::string bytes = read_all(dir / "q.gguf");
    const GgufTensor& t = q.tensor("blk.1.ffn_down_exps.weight");
    const uint64_t at = uint64_t(q.data(t) - q.mapped(t)->data()) + 2 * ggml_block_bytes(GgmlType(t.type));
    bytes[at] = '\x00', bytes[at + 1] = '\x7c';  // f16 +inf: the first field of every 32-value type
    test::write_bytes(dir / "bad.gguf", bytes);
  }
  const std::string want = fmt::format("bad.gguf: tensor 'model.layers.1.mlp.experts.0.down_proj.weight' ({}): block 2 "
                                       "has a scale that is not finite",
                                       ggml_type_name(q.tensor("blk.1.ffn_down_exps.weight").type));
  test::expect_error([&] { Model::load(dir / "bad.gguf"); }, want);
  test::expect_error(
      [&] {
        auto m = Model::load(dir / "bad.gguf", {.offload_experts = ExpertOffloadOptions{.memory = parse_expert_memory("100%")}});
        ModelInput in;
        for (int i = 0; i < 64; ++i) in.ids.push_back(int32_t((i * 37 + 11) % m->config().vocab_size));
        in.tokens = TokenBatch::uniform(1, int64_t(in.ids.size()));
        m->forward(in, {.precision = Precision::F32, .outputs = Outputs::All});
      },
      want);
}

TEST(KimiGguf, AModelPathThatIsNeitherGgufNorDirectorySaysWhatItIs) {
  TempDir dir;
  test::write_bytes(dir / "bad.gguf", std::string("GGUX") + std::string(60, '\0'));
  test::expect_error([&] { open_model_files(dir / "bad.gguf"); },
                     "bad.gguf: not a model: a file that does not start with the GGUF magic");
  test::write_bytes(dir / "short.gguf", "GG");
  test::expect_error([&] { open_model_files(dir / "short.gguf"); }, "short.gguf: not a model: a file of 2 bytes");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  test::expect_error([&] { open_model_files(dir / "fifo"); }, "fifo: not a model: neither a directory nor a regular file");
  test::expect_error([&] { model_config_of(dir / "fifo"); }, "fifo: not a model");
  test::expect_error([&] { open_model_files(dir / "missing"); }, "missing: no such file or directory");
}

// The latent norms' eps: layer_norm_rms_epsilon, as llama.cpp's graph reads it, unless hyla's own
// key says the model was made with another (SPEC §4).
TEST(KimiGguf, TheLatentNormEpsIsWrittenOnlyWhereItDiffers) {
  TempDir dir;
  ModelConfig config = save_random("configs/kimi-k3-tiny.json", dir / "model");
  save_gguf(dir / "same.gguf", config, ModelWeights(dir / "model"), {});
  const GgufFile same(dir / "same.gguf");
  EXPECT_FALSE(same.has("kimi-k3.attention.latent_norm_rms_epsilon"));
  EXPECT_EQ(config_from_gguf(same).mla.norm_eps, float(config.rms_norm_eps));
  config.mla.norm_eps = 1e-6;
  save_gguf(dir / "other.gguf", config, ModelWeights(dir / "model"), {});
  const GgufFile other(dir / "other.gguf");
  EXPECT_EQ(other.number("kimi-k3.attention.latent_norm_rms_epsilon"), float(1e-6));
  EXPECT_EQ(config_from_gguf(other).mla.norm_eps, float(1e-6));
  EXPECT_EQ(config_from_gguf(other).rms_norm_eps, float(config.rms_norm_eps));
}

TEST(KimiGguf, AK3FileWithoutTheRoutedNormSkipsTheNorm) {
  // llama.cpp's graph skips ffn_routed_norm when a file has none: hyla reads moe.latent_norm false.
  TempDir dir;
  auto j = parse_json_file((test::source_dir() / "configs/kimi-k3-tiny.json").string());
  j["moe"]["latent_norm"] = false;
  write_file_atomic(dir / "config.json", j.dump());
  const ModelConfig config = save_random((dir / "config.json").string(), dir / "model");
  ASSERT_FALSE(config.moe.latent_norm);
  save_gguf(dir / "m.gguf", config, ModelWeights(dir / "model"), {});
  const GgufFile g(dir / "m.gguf");
  EXPECT_EQ(g.find("blk.1.ffn_routed_norm.weight"), nullptr);
  EXPECT_FALSE(config_from_gguf(g).moe.latent_norm);
  EXPECT_LT(max_abs_difference(logits_of(*Model::load(dir / "m.gguf")), logits_of(*Model::load(dir / "model"))), 1e-5);
}

TEST(KimiGguf, ConfigsLlamaCppCannotRunAreErrors) {
  const ModelConfig k3 = model_config_of((test::source_dir() / "configs/kimi-k3-tiny.json").string());
  auto expect_refused = [&](const std::function<void(ModelConfig&)>& edit, const std::string& what) {
    ModelConfig c = k3;
    edit(c);
    test::expect_error([&] { check_architecture(c, "edited"); }, what);
  };
  expect_refused([](ModelConfig& c) { c.layer_types[3] = LayerType::Swa; }, "sliding-window");
  expect_refused([](ModelConfig& c) { c.mla.num_heads = 4; }, "kda.num_heads must equal mla.num_heads");
  expect_refused([](ModelConfig& c) { c.kda.gate_rank = 8; }, "kda.gate_rank");
  expect_refused([](ModelConfig& c) { c.mla.rope = true; }, "mla.rope");
  expect_refused([](ModelConfig& c) { c.moe.dense_activation = Activation::Swiglu; }, "SiTU");
  expect_refused([](ModelConfig& c) { c.moe.router_latent_dim = 8; }, "router_latent_dim");
  expect_refused([](ModelConfig& c) { c.kda.output_gate_rank = 8; }, "kimi-k3's KDA output gate is full rank");
  const ModelConfig nano = test::nano_config();
  // hyla's own architecture has no GGUF; naming kimi_k3 for nano's options breaks K3's rules.
  test::expect_error([&] { gguf_architecture(nano, "nano"); }, "architecture hyla has no llama.cpp GGUF format");
  ModelConfig nano_k3 = nano;
  nano_k3.architecture = "kimi_k3";
  test::expect_error([&] { gguf_architecture(nano_k3, "nano"); }, "not a kimi_k3 model");
}

TEST(KimiGguf, WrongOrMissingTensorsNameThemselves) {
  TempDir dir;
  const ModelConfig config = save_random("configs/kimi-linear-tiny.json", dir / "model");
  const ModelWeights weights(dir / "model");
  save_gguf(dir / "m.gguf", config, weights, {});
  // Another architecture's config against this file.
  ModelConfig other = config;
  other.moe.num_experts = 8;
  const auto gguf = std::make_shared<const GgufFile>(dir / "m.gguf");
  test::expect_error([&] { weights_from_gguf(gguf, other); }, "blk.1.ffn_gate_inp.weight");
  // A block_count the tensors do not back is refused before anything is sized from it.
  {
    GgufMetadata meta = gguf->metadata();
    meta["kimi-linear.block_count"] = GgufValue::u32(100000);
    std::vector<GgufTensor> tensors;
    for (const GgufTensor& t : gguf->tensors()) tensors.push_back({t.name, t.ne, t.type, 0, 0});
    GgufWriter lie(dir / "lie.gguf", meta, tensors);
    for (const GgufTensor& t : gguf->tensors()) lie.write(gguf->data(t), t.bytes);
    lie.commit();
    test::expect_error([&] { Model::load(dir / "lie.gguf"); },
                       "lie.gguf: kimi-linear.block_count is 100000 but the file holds 8 layers' tensors");
  }
  // A truncated file.
  const std::string bytes = read_all(dir / "m.gguf");
  test::write_bytes(dir / "cut.gguf", bytes.substr(0, bytes.size() / 2));
  test::expect_error([&] { Model::load(dir / "cut.gguf"); }, "cut.gguf: truncated");
  // An architecture hyla does not read.
  GgufWriter w(dir / "llama.gguf", {{"general.architecture", GgufValue::string("llama")}}, {});
  w.commit();
  test::expect_error([&] { Model::load(dir / "llama.gguf"); }, "architecture 'llama'");
}


// The released config.json files shrunk to the tiny configs' shapes.
nlohmann::json tiny_hf_config(bool k3) {
  nlohmann::json j = parse_json_file((test::source_dir() / (k3 ? "tests/data/kimi-k3-hf-config.json"
                                                                : "tests/data/kimi-linear-48b-a3b-hf-config.json"))
                                         .string());
  nlohmann::json& t = k3 ? j["text_config"] : j;
  t.update({{"vocab_size", 512}, {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 8},
            {"num_attention_heads", 2}, {"num_key_value_heads", 2}, {"kv_lora_rank", 32}, {"qk_nope_head_dim", 16},
            {"qk_rope_head_dim", 8}, {"v_head_dim", 16}, {"moe_intermediate_size", 32}, {"num_experts", 16},
            {"max_position_embeddings", 65536}});
  t[k3 ? "num_experts_per_token" : "num_experts_per_token"] = 4;
  // The released K3 scales the routing weights by 1.0; the tiny config by 2.5, which exercises the scale.
  if (k3)
    t.update({{"q_lora_rank", 32}, {"routed_expert_hidden_size", 32}, {"attn_res_block_size", 2},
              {"routed_scaling_factor", 2.5}});
  t["linear_attn_config"].update({{"full_attn_layers", {4, 8}}, {"kda_layers", {1, 2, 3, 5, 6, 7}}, {"num_heads", 2},
                                  {"head_dim", 16}});
  j.erase("vision_config");  // text only: these checkpoints hold no vision tower
  return j;
}

// hyla's tensors renamed and reshaped as the released checkpoints store them.
std::string hf_name(const std::string& name) {
  std::string n = name;
  auto swap = [&](const std::string& from, const std::string& to) {
    const size_t at = n.find(from);
    if (at != std::string::npos) n.replace(at, from.size(), to);
  };
  swap(".mlp.gate.", ".block_sparse_moe.gate.");
  swap(".mlp.shared_experts.", ".block_sparse_moe.shared_experts.");
  swap(".mlp.lat_down.", ".block_sparse_moe.routed_expert_down_proj.");
  swap(".mlp.lat_up.", ".block_sparse_moe.routed_expert_up_proj.");
  swap(".mlp.lat_norm.", ".block_sparse_moe.routed_expert_norm.");
  if (n.find(".mlp.experts.") != std::string::npos) {
    swap(".mlp.experts.", ".block_sparse_moe.experts.");
    swap(".gate_proj.", ".w1."), swap(".down_proj.", ".w2."), swap(".up_proj.", ".w3.");
  }
  swap(".attn_res_query", ".self_attention_res_proj.weight");
  swap(".attn_res_norm.", ".self_attention_res_norm.");
  swap(".mlp_res_query", ".mlp_res_proj.weight");
  swap("model.out_res_query", "model.output_attn_res_proj.weight");
  swap("model.out_res_norm.", "model.output_attn_res_norm.");
  return n;
}

// The model with its weights rounded as a bf16 checkpoint stores them.
std::unique_ptr<Model> bf16_rounded_copy(const Model& model) {
  auto rounded = std::make_unique<Model>(model.config());
  for (const auto& p : model.params().params()) {
    const Tensor r = p->value.to(DType::BF16).to(DType::F32);
    std::memcpy(rounded->params().get(p->name).v(), r.data<float>(), r.nbytes());
  }
  rounded->params().refresh_bf16();
  return rounded;
}

TEST(KimiHf, ReleasedLayoutReadsAsTheSameModel) {
  for (const bool k3 : {true, false}) {
    TempDir dir;
    const nlohmann::json hf = tiny_hf_config(k3);
    test::write_bytes(dir / "config.json", hf.dump(1));
    const ModelConfig config = model_config_of((dir / "config.json").string());
    const ModelConfig tiny =
        model_config_of((test::source_dir() / (k3 ? "configs/kimi-k3-tiny.json" : "configs/kimi-linear-tiny.json")).string());
    nlohmann::json a = config.to_json(), b = tiny.to_json();
    a["kda"].erase("chunk_size"), b["kda"].erase("chunk_size");
    a["mla"].erase("norm_eps"), b["mla"].erase("norm_eps");  // HF: the official code's 1e-6 (SPEC §4)
    EXPECT_EQ(config.mla.norm_eps, 1e-6);
    EXPECT_EQ(a.dump(1), b.dump(1)) << k3;
    Model model(config);
    model.initialize(2);
    test::randomize_params(model.params(), 9);
    NamedTensors tensors;
    for (const auto& p : model.params().params()) {
      Tensor v = p->value;
      const std::string n = hf_name(p->name);
      if (n.ends_with("A_log")) v = v.reshape(k3 ? Shape{p->shape[0]} : Shape{1, 1, p->shape[0], 1});
      if (n.ends_with("conv1d.weight")) v = v.reshape(Shape{p->shape[0], p->shape[2]});
      if (n.ends_with("res_proj.weight")) v = v.reshape(Shape{1, p->shape[0]});
      tensors.emplace_back((k3 ? "language_model." : "") + n, v.to(DType::BF16));
    }
    if (k3) tensors.emplace_back("vision_tower.patch_embed.weight", Tensor::zeros(DType::BF16, {4, 4}));
    save_model_weights(dir.path(), tensors, /*max_shard_bytes=*/200000);
    ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
    const auto loaded = Model::load(dir.path());
    const std::unique_ptr<Model> rounded = bf16_rounded_copy(model);
    EXPECT_EQ(max_abs_difference(logits_of(*loaded), logits_of(*rounded)), 0) << k3;

    // A layer count the tensors do not back is refused before anything is sized from it.
    nlohmann::json lying = hf;
    (k3 ? lying["text_config"] : lying)["num_hidden_layers"] = 100000;
    test::write_bytes(dir / "config.json", lying.dump(1));
    const auto start = std::chrono::steady_clock::now();
    test::expect_error([&] { Model::load(dir.path()); }, "num_hidden_layers is 100000 but the weights hold only");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
    (k3 ? lying["text_config"] : lying)["num_hidden_layers"] = 9;
    test::write_bytes(dir / "config.json", lying.dump(1));
    test::expect_error([&] { Model::load(dir.path()); }, "num_hidden_layers is 9 but the weights hold no tensor of layer 8");
    test::write_bytes(dir / "config.json", hf.dump(1));

    // An expert given twice (as w1.weight and as compressed-tensors' w1.weight_packed) names both.
    tensors.emplace_back("model.layers.1.block_sparse_moe.experts.0.w1.weight_packed", Tensor::zeros(DType::U8, {32, 32}));
    save_model_weights(dir.path(), tensors);
    test::expect_error([&] { Model::load(dir.path()); }, "experts.0.w1.weight_packed");
  }
}


// Kimi K3's vision_config and vision tensors read as SPEC §7.2's MoonViT, under the checkpoint's
// names (the patch convolution as [D, 3, P, P]): the same logits for a prompt with an image.
TEST(KimiHf, K3VisionTowerReadsFromTheCheckpoint) {
  TempDir dir;
  nlohmann::json hf = tiny_hf_config(true);
  hf["vision_config"] = {{"activation_func", "gelu_pytorch_tanh"}, {"attn_bias", false}, {"init_pos_emb_height", 3},
                         {"init_pos_emb_width", 3}, {"linear_bias", false}, {"merge_kernel_size", {2, 2}},
                         {"merge_type", "sd2_tpool"}, {"mlp_type", "mlp2"}, {"mm_hidden_size", 16},
                         {"mm_projector_type", "patchmergerv2"}, {"norm_type", "rmsnorm"},
                         {"patch_embed_proj_bias", false}, {"patch_size", 2}, {"pos_emb_interpolation_mode", "bilinear"},
                         {"pos_emb_type", "divided_fixed"}, {"projector_hidden_act", "gelu"},
                         {"projector_ln_eps", 1e-05}, {"qkv_hidden_size", 24}, {"text_hidden_size", 64},
                         {"vt_hidden_size", 16}, {"vt_intermediate_size", 24}, {"vt_num_attention_heads", 3},
                         {"vt_num_hidden_layers", 2}};
  test::write_bytes(dir / "config.json", hf.dump(1));
  const ModelConfig config = model_config_of((dir / "config.json").string());
  ASSERT_TRUE(config.vision.enabled);
  EXPECT_EQ(config.vision.moonvit.head_dim, 8);
  Model model(config);
  model.initialize(2);
  test::randomize_params(model.params(), 19);
  NamedTensors tensors;
  for (const auto& p : model.params().params()) {
    Tensor v = p->value;
    const bool vision = p->name.starts_with("vision_tower.") || p->name.starts_with("mm_projector.");
    const std::string n = vision ? p->name : "language_model." + hf_name(p->name);
    if (n == "vision_tower.patch_embed.proj.weight") v = v.reshape(Shape{p->shape[0], 3, 2, 2});
    if (n.ends_with("A_log")) v = v.reshape(Shape{p->shape[0]});
    if (n.ends_with("conv1d.weight")) v = v.reshape(Shape{p->shape[0], p->shape[2]});
    if (n.ends_with("res_proj.weight")) v = v.reshape(Shape{1, p->shape[0]});
    tensors.emplace_back(n, v.to(DType::BF16));
  }
  save_model_weights(dir.path(), tensors);
  const auto loaded = Model::load(dir.path());
  const std::unique_ptr<Model> rounded = bf16_rounded_copy(model);
  ModelInput in;
  const int32_t pad = 250;
  in.ids = {5, 248, pad, pad, pad, pad, pad, pad, 249, 17, 33, 8};
  in.tokens = TokenBatch::packed({12});
  in.image_pad_id = pad;
  Image img{8, 12, 3, {}};  // 4 × 6 patches of 2×2: 2 × 3 merged tokens
  for (int i = 0; i < 8 * 12 * 3; ++i) img.pixels.push_back(uint8_t((i * 53 + 7) % 256));
  in.images = {img};
  const ForwardOptions options{.precision = Precision::F32, .outputs = Outputs::All};
  const Tensor a = loaded->forward(in, options).logits, b = rounded->forward(in, options).logits;
  EXPECT_EQ(max_abs_difference(a, b), 0);
  // The image is read: other pixels give other logits.
  in.images[0].pixels[0] ^= 0xff;
  EXPECT_GT(max_abs_difference(loaded->forward(in, options).logits, a), 0);
  // A text GGUF leaves the tower out, as llama.cpp's converter does.
  EXPECT_EQ(gguf_architecture(config, "k3").gguf_arch, "kimi-k3");
}

// Rewrites the dtype of every tensor of a safetensors file whose name ends with `suffix`.
void retype_safetensors(const fs::path& file, const std::string& suffix, const std::string& dtype) {
  const std::string bytes = read_all(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  for (auto& [name, entry] : header.items())
    if (name.ends_with(suffix)) entry["dtype"] = dtype;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t m = text.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  out += text;
  out += bytes.substr(8 + n);
  test::write_bytes(file, out);
}

// K3's release: routed experts as compressed-tensors MXFP4 (weight_packed U8, weight_scale
// F8_E8M0), the rest bf16. hyla keeps the experts MXFP4 (the f32 logits are those of the float
// model holding their values), and convert writes them to GGUF as ggml MXFP4, bit for bit.
TEST(KimiHf, CompressedTensorsMxfp4ExpertsStayMxfp4) {
  TempDir dir;
  const nlohmann::json hf = tiny_hf_config(true);
  test::write_bytes(dir / "config.json", hf.dump(1));
  const ModelConfig config = model_config_of((dir / "config.json").string());
  Model model(config);
  model.initialize(2);
  test::randomize_params(model.params(), 9);
  NamedTensors tensors;
  for (const auto& p : model.params().params()) {
    std::string n = "language_model." + hf_name(p->name);
    if (p->component == Component::RoutedExperts) {
      const int64_t rows = p->shape[0], cols = p->shape[1];
      Tensor codes = Tensor::empty(DType::U8, {rows, cols / 2}), scales = Tensor::empty(DType::U8, {rows, cols / 32});
      quantize_mxfp4_weights(p->v(), rows, cols, codes.data<uint8_t>(), scales.data<uint8_t>());
      for (int64_t i = 0; i < p->numel(); ++i) {  // the float model now holds the experts' MXFP4 values
        const uint8_t byte = codes.data<uint8_t>()[i / 2];
        p->v()[i] = mxfp4_value(i % 2 ? byte >> 4 : byte & 15, scales.data<uint8_t>()[i / 32]);
      }
      n.erase(n.size() - std::string("weight").size());
      tensors.emplace_back(n + "weight_packed", codes);
      tensors.emplace_back(n + "weight_scale", scales);
      continue;
    }
    const Tensor r = p->value.to(DType::BF16);
    std::memcpy(p->v(), r.to(DType::F32).data<float>(), size_t(p->numel()) * 4);
    Tensor v = r;
    if (n.ends_with("A_log")) v = v.reshape(Shape{p->shape[0]});
    if (n.ends_with("conv1d.weight")) v = v.reshape(Shape{p->shape[0], p->shape[2]});
    if (n.ends_with("res_proj.weight")) v = v.reshape(Shape{1, p->shape[0]});
    tensors.emplace_back(n, v);
  }
  model.params().refresh_bf16();
  save_model_weights(dir.path(), tensors, uint64_t(1) << 40);
  retype_safetensors(dir / "model.safetensors", ".weight_scale", "F8_E8M0");
  const auto loaded = Model::load(dir.path());
  EXPECT_TRUE(loaded->params().get("model.layers.1.mlp.experts.5.up_proj.weight").is_mxfp4());
  const Tensor want = logits_of(model);
  // The yardstick for f32 rounding: how far one ulp up in every expert weight moves these logits
  // (random weights amplify it: ~1e-4 of their scale, where the reordered sums land too).
  Model nudged(config);
  for (const auto& p : model.params().params()) {
    float* dst = nudged.params().get(p->name).v();
    for (int64_t i = 0; i < p->numel(); ++i)
      dst[i] = p->component == Component::RoutedExperts ? std::nextafter(p->v()[i], 1e30f) : p->v()[i];
  }
  nudged.params().refresh_bf16();
  const double ulp = max_abs_difference(logits_of(nudged), want);
  ASSERT_GT(ulp, 0);
  EXPECT_LT(max_abs_difference(logits_of(*loaded), want), 2 * ulp);

  const test::CommandResult r = test::run_hyla(fmt::format("convert -m {} --out {} --to gguf --type bf16",
                                                          dir.path().string(), (dir / "k3.gguf").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const GgufFile g(dir / "k3.gguf");
  EXPECT_EQ(g.tensor("blk.1.ffn_up_exps.weight").type, uint32_t(GgmlType::MXFP4));
  EXPECT_EQ(g.tensor("blk.1.attn_output.weight").type, uint32_t(GgmlType::BF16));
  EXPECT_EQ(g.integer("general.file_type"), 38);
  const auto from_gguf = Model::load(dir / "k3.gguf");
  EXPECT_TRUE(from_gguf->params().get("model.layers.1.mlp.experts.5.up_proj.weight").is_mxfp4());
  EXPECT_LT(max_abs_difference(logits_of(*from_gguf), want), 2 * ulp);
  // Streamed from the GGUF with a quarter of the experts resident: the same logits, bit for bit.
  const auto offloaded = Model::load(
      dir / "k3.gguf", {.offload_experts = ExpertOffloadOptions{parse_expert_memory("25%"), ExpertCachePolicy::Lru, true}});
  EXPECT_EQ(max_abs_difference(logits_of(*offloaded), logits_of(*from_gguf)), 0);
  EXPECT_GT(offloaded->expert_offload()->stats().total().fetches, 0);
  // And back to a hyla directory: the experts' bytes as they were.
  const test::CommandResult back = test::run_hyla(
      fmt::format("convert -m {} --out {}", (dir / "k3.gguf").string(), (dir / "back").string()));
  ASSERT_EQ(back.exit_code, 0) << back.output;
  const ModelWeights original(dir.path()), returned(dir / "back");
  const Tensor a = original.get("language_model.model.layers.3.block_sparse_moe.experts.2.w2.weight_packed"),
               b = returned.get("model.layers.3.mlp.experts.2.down_proj.weight");
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

// A vocabulary written as llama.cpp's GGUF metadata reads back as the same tokenizer: hyla's own
// (pre "qwen2") and a tiktoken one (pre "kimi-k2"), padded to the model's rows.
TEST(GgufVocab, TokenizersRoundTrip) {
  std::string ranks;
  for (int b = 0; b < 256; ++b) ranks += base64_encode(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  int rank = 256;
  for (const char* t : {"th", "he", "the", " t", "in", "ing"}) ranks += base64_encode(t) + " " + std::to_string(rank++) + "\n";
  TokenizerSpec kimi_spec = tokenizer_spec_from_tiktoken(ranks, kKimiPattern, "kimi");
  kimi_spec.added_tokens.push_back({rank, "<|im_end|>"});
  const Tokenizer kimi(std::move(kimi_spec), "kimi");
  const std::string text = test::sample_text(3, 2) + " 世界 the thing <|endoftext|><|im_end|>\n\n  123456";
  for (const Tokenizer* tok : {&test::small_tokenizer(), &kimi}) {
    TempDir dir;
    GgufMetadata meta{{"general.architecture", GgufValue::string("kimi-k3")}};
    add_gguf_tokenizer(*tok, tok->vocab_size() + 7, meta);
    GgufWriter(dir / "v.gguf", meta, {}).commit();
    const GgufFile g(dir / "v.gguf");
    EXPECT_EQ(g.integers("tokenizer.ggml.token_type").size(), size_t(tok->vocab_size() + 7));
    const std::optional<Tokenizer> back = tokenizer_from_gguf(g);
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(back->vocab_size(), tok->vocab_size());
    EXPECT_EQ(back->encode(text, true), tok->encode(text, true));
    EXPECT_EQ(back->decode(back->encode(text, true)), text);
    EXPECT_EQ(load_model_tokenizer(dir / "v.gguf").encode(text, true), tok->encode(text, true));
  }
}

TEST(GgufVocab, VocabulariesHylaCannotReadNameThemselves) {
  TempDir dir;
  auto write = [&](GgufMetadata meta) {
    meta["general.architecture"] = GgufValue::string("kimi-k3");
    GgufWriter(dir / "v.gguf", meta, {}).commit();
    return GgufFile(dir / "v.gguf");
  };
  EXPECT_FALSE(tokenizer_from_gguf(write({{"tokenizer.ggml.model", GgufValue::string("none")}})).has_value());
  test::expect_error([&] { tokenizer_from_gguf(write({{"tokenizer.ggml.model", GgufValue::string("llama")}})); },
                     "tokenizer.ggml.model 'llama'");
  test::expect_error(
      [&] {
        tokenizer_from_gguf(write({{"tokenizer.ggml.model", GgufValue::string("gpt2")},
                                   {"tokenizer.ggml.pre", GgufValue::string("deepseek-llm")},
                                   {"tokenizer.ggml.tokens", GgufValue::of_array(GgufValueType::String, {"a"})}}));
      },
      "tokenizer.ggml.pre 'deepseek-llm'");
  test::expect_error([&] { load_model_tokenizer(dir / "v.gguf"); }, "v.gguf");
}

TEST(GgufVocab, ConvertCarriesTheTokenizer) {
  TempDir dir;
  save_random("configs/kimi-linear-tiny.json", dir / "model");
  test::small_tokenizer().save(dir / "model" / "tokenizer.json");
  const std::string m = (dir / "model").string(), gguf = (dir / "m.gguf").string(), back = (dir / "back").string();
  test::CommandResult r = test::run_hyla(fmt::format("convert -m {} --out {}", m, gguf));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("with the vocabulary"), std::string::npos) << r.output;
  r = test::run_hyla(fmt::format("convert -m {} --out {}", gguf, back));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = "the light and the dark";
  EXPECT_EQ(Tokenizer::load(dir / "back" / "tokenizer.json").encode(text), test::small_tokenizer().encode(text));
  r = test::run_hyla(fmt::format("logits -m {} --text '{}' --out {}", gguf, text, (dir / "l.safetensors").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // `hyla plan` reads the config a GGUF carries: the same parameters and memory as the directory's
  // (compute differs only by kda.chunk_size, a setting of hyla's that GGUF does not carry).
  const test::CommandResult from_gguf = test::run_hyla("plan --config " + gguf), from_dir = test::run_hyla("plan --config " + m);
  ASSERT_EQ(from_gguf.exit_code, 0) << from_gguf.output;
  const auto upto_compute = [](const std::string& s) { return s.substr(0, s.find("compute per token")); };
  EXPECT_EQ(upto_compute(from_gguf.output), upto_compute(from_dir.output));
}

// `hyla init --out FILE.gguf` streams a freshly initialised model (initialized_weights.h): the
// same file, tensor for tensor, as init → quantize --experts mxfp4 --only-experts → convert.
TEST(KimiGguf, InitWritesTheGgufOfInitQuantizeConvert) {
  for (const char* config : {"configs/kimi-linear-tiny.json", "configs/kimi-k3-tiny.json"}) {
    TempDir dir;
    const std::string c = (test::source_dir() / config).string(), streamed = (dir / "streamed.gguf").string(),
                      made = (dir / "made.gguf").string();
    test::CommandResult r = test::run_hyla(fmt::format("init --config {} --seed 7 --out {} --type bf16 --experts mxfp4", c, streamed));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("experts mxfp4"), std::string::npos) << r.output;
    for (const std::string& step :
         {fmt::format("init --config {} --seed 7 --out {}", c, (dir / "f32").string()),
          fmt::format("quantize -m {} --experts mxfp4 --only-experts --out {}", (dir / "f32").string(), (dir / "q").string()),
          fmt::format("convert -m {} --out {} --type bf16", (dir / "q").string(), made)}) {
      r = test::run_hyla(step);
      ASSERT_EQ(r.exit_code, 0) << step << "\n" << r.output;
    }
    const GgufFile a(streamed), b(made);
    ASSERT_EQ(a.tensors().size(), b.tensors().size()) << config;
    size_t mxfp4 = 0;
    for (size_t i = 0; i < a.tensors().size(); ++i) {
      const GgufTensor &x = a.tensors()[i], &y = b.tensors()[i];
      ASSERT_EQ(x.name, y.name);
      ASSERT_EQ(x.type, y.type) << x.name;
      ASSERT_EQ(x.bytes, y.bytes) << x.name;
      EXPECT_EQ(std::memcmp(a.data(x), b.data(y), x.bytes), 0) << config << " " << x.name;
      mxfp4 += x.type == uint32_t(GgmlType::MXFP4);
    }
    EXPECT_GT(mxfp4, 0u) << config;
    GgufMetadata ma = a.metadata(), mb = b.metadata();
    EXPECT_EQ(ma.at("general.name").value, "hyla init");
    ma.erase("general.name");
    mb.erase("general.name");
    EXPECT_EQ(ma.size(), mb.size());
    for (const auto& [k, v] : ma) EXPECT_EQ(v.value, mb.at(k).value) << k;
  }
  // A model directory is streamed too: MXFP4 experts as hyla quantize writes them, the rest as init.
  TempDir dir;
  const std::string c = (test::source_dir() / "configs/kimi-linear-tiny.json").string();
  const fs::path streamed = dir / "streamed", made = dir / "q";
  for (const std::string& step :
       {fmt::format("init --config {} --seed 7 --out {} --experts mxfp4", c, streamed.string()),
        fmt::format("init --config {} --seed 7 --out {}", c, (dir / "f").string()),
        fmt::format("quantize -m {} --experts mxfp4 --only-experts --out {}", (dir / "f").string(), made.string())}) {
    const test::CommandResult r = test::run_hyla(step);
    ASSERT_EQ(r.exit_code, 0) << step << "\n" << r.output;
  }
  const ModelWeights a(streamed), b(made);
  ASSERT_EQ(a.names(), b.names());
  size_t mxfp4 = 0;
  for (const std::string& name : a.names()) {
    const Tensor x = a.get(name), y = b.get(name);
    ASSERT_EQ(x.dtype(), y.dtype()) << name;
    ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << name;
    mxfp4 += x.dtype() == DType::U8;
  }
  EXPECT_GT(mxfp4, 0u);
  const test::CommandResult r = test::run_hyla(fmt::format("init --config {} --out {} --type bf16", c, (dir / "d").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--type is for a FILE.gguf"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hyla
