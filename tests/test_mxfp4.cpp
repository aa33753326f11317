// MXFP4 routed experts (kernels/mxfp4_gemm.h, model/mxfp4_weights.h): every code's value, the
// quantiser's rounding, the kernels against a double reference and against each other bit for bit
// (decode and prefill shapes, partial panels, fused parts, strides, beta); hyla quantize --experts
// mxfp4 → Model::load, whose f32 logits are the float model's with the dequantised experts; the
// offloaded model's logits bit for bit; malformed MXFP4 tensors named in one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "hyla/core/memory.h"
#include "hyla/kernels/mxfp4_gemm.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/io/gguf.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/expert_offload.h"
#include "hyla/model/model.h"
#include "hyla/model/mxfp4_weights.h"
#include "hyla/quant/quantize_model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace hyla {
namespace {

namespace fs = std::filesystem;

constexpr double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double value_of(uint8_t code, uint8_t scale) {
  const double magnitude = kE2M1[code & 7];
  return std::ldexp((code & 8) ? -magnitude : magnitude, int(scale) - 127);
}

// A matrix in the file form with its packed copy.
struct TestMatrix {
  int64_t rows, cols;
  std::vector<uint8_t> codes, scales;
  std::shared_ptr<void> packed;
  Mxfp4PackedMatrix view() const { return {static_cast<const uint8_t*>(packed.get()), rows, cols}; }
  double weight(int64_t r, int64_t c) const {
    const uint8_t byte = codes[size_t(r * cols / 2 + c / 2)];
    return value_of(c % 2 ? byte >> 4 : byte & 15, scales[size_t(r * cols / 32 + c / 32)]);
  }
};

// Random codes (every one of the 16) and scales around 2^0 (120..134).
TestMatrix random_matrix(int64_t rows, int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  TestMatrix m{rows, cols, std::vector<uint8_t>(size_t(rows * cols / 2)), std::vector<uint8_t>(size_t(rows * cols / 32)),
               allocate_aligned(size_t(mxfp4_packed_bytes(rows, cols)))};
  for (uint8_t& c : m.codes) c = uint8_t(rng());
  for (uint8_t& s : m.scales) s = uint8_t(120 + rng() % 15);
  mxfp4_pack(m.codes.data(), m.scales.data(), rows, cols, static_cast<uint8_t*>(m.packed.get()));
  return m;
}

std::vector<Mxfp4Kernel> kernels() {
  std::vector<Mxfp4Kernel> k{Mxfp4Kernel::Native, Mxfp4Kernel::Portable};
  if (mxfp4_kernel_available(Mxfp4Kernel::Avx2)) k.push_back(Mxfp4Kernel::Avx2);
  return k;
}

// y (n rows, stride ld_y) against x · [parts]ᵀ + beta · before in double: the weights are exact, so
// the error is f32 rounding in the sums, at most (cols + 2) ulp of Σ |x w| (fused multiply-adds in
// a chain of 16 per nibble half, then one per block).
void expect_matches_reference(const std::vector<float>& x, int64_t n, int64_t ld_x,
                              const std::vector<const TestMatrix*>& parts, const std::vector<float>& y, int64_t ld_y,
                              float beta, const std::vector<float>& before, const std::string& what) {
  int64_t column = 0;
  for (const TestMatrix* m : parts) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < m->rows; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t c = 0; c < m->cols; ++c) {
          const double term = double(x[size_t(r * ld_x + c)]) * m->weight(j, c);
          sum += term, magnitude += std::fabs(term);
        }
        const double add = double(beta) * before[size_t(r * ld_y + column + j)], ref = sum + add;
        ASSERT_NEAR(y[size_t(r * ld_y + column + j)], ref,
                    double(m->cols / 32 + 18) * 0x1p-23 * magnitude + 0x1p-22 * std::fabs(add))
            << what << " row " << r << " output " << column + j;
      }
    column += m->rows;
  }
}

TEST(Mxfp4, EveryCodeDecodesExactlyUnderEveryScale) {
  // (6 · 2^127 and 4 · 2^127 are beyond f32: infinite in both.)
  for (int scale = 0; scale < 255; ++scale)
    for (int code = 0; code < 16; ++code)
      ASSERT_EQ(mxfp4_value(uint8_t(code), uint8_t(scale)), float(value_of(uint8_t(code), uint8_t(scale))))
          << "code " << code << " scale " << scale;
  const uint8_t scales[] = {0, 127, 254, 255, 3};
  EXPECT_EQ(mxfp4_first_nan_scale(scales, 5), 3);
  EXPECT_EQ(mxfp4_first_nan_scale(scales, 3), -1);
}

TEST(Mxfp4, QuantiserRoundsToTheNearestCodeTiesToEven) {
  // max |x| = 6 puts the scale at 2^0 (floor(log2 6) − 2 = 0): each x is rounded on the E2M1 grid.
  float x[32] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -5.0f, 0.3f, 2.9f, -6.0f, 4.4f};
  uint8_t codes[16];
  EXPECT_EQ(mxfp4_quantize_block(x, codes), 127);
  const float expected[15] = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -0.0f, -1.0f, -4.0f, 0.5f, 3.0f, -6.0f, 4.0f};
  for (int i = 0; i < 15; ++i) {
    const uint8_t code = i % 2 ? codes[i / 2] >> 4 : codes[i / 2] & 15;
    EXPECT_EQ(mxfp4_value(code, 127), expected[i]) << i << ": " << x[i];
  }
  // Any block: the largest magnitude lands in [4, 8) · 2^(e−127), and every value within half a step.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int trial = 0; trial < 200; ++trial) {
    float block[32];
    float max_abs = 0;
    for (float& v : block) v = normal(rng), max_abs = std::max(max_abs, std::fabs(v));
    const uint8_t e = mxfp4_quantize_block(block, codes);
    const double unit = std::ldexp(1.0, int(e) - 127);
    ASSERT_GE(max_abs, 4 * unit);
    ASSERT_LT(max_abs, 8 * unit);
    for (int i = 0; i < 32; ++i) {
      const uint8_t code = i % 2 ? codes[i / 2] >> 4 : codes[i / 2] & 15;
      const double q = mxfp4_value(code, e), err = std::fabs(q - double(block[i]));
      // The grid's step around |x|: ½ below 2, 1 below 4, 2 above (saturating at 6 for [6, 8)).
      const double a = std::fabs(double(block[i])) / unit;
      const double bound = a >= 6 ? a - 6 : (a < 2 ? 0.25 : a < 4 ? 0.5 : 1.0);
      ASSERT_LE(err, bound * unit * (1 + 1e-6)) << "trial " << trial << " value " << i;
    }
  }
}

// GGUF's blocks (scale, then values 0–15 in low nibbles and 16–31 in high ones) packed in one pass
// give the bytes of the file form's packing, partial panels included; the first NaN scale is named.
TEST(Mxfp4, PackingGgmlBlocksEqualsPackingTheFileForm) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 32}, {37, 96}, {130, 2304}}) {
    TestMatrix m = random_matrix(rows, cols, unsigned(rows + cols));
    std::vector<uint8_t> blocks(size_t(rows * cols / 32 * kGgmlMxfp4BlockBytes));
    mxfp4_codes_to_blocks(m.codes.data(), m.scales.data(), rows * cols, blocks.data());
    const size_t bytes = size_t(mxfp4_packed_bytes(rows, cols));
    std::vector<uint8_t> packed(bytes, 0xAB);
    EXPECT_EQ(mxfp4_pack_blocks(blocks.data(), rows, cols, packed.data()), -1);
    EXPECT_EQ(std::memcmp(packed.data(), m.packed.get(), bytes), 0) << rows << "x" << cols;
    EXPECT_EQ(mxfp4_blocks_first_nan_scale(blocks.data(), rows * cols / 32), -1);

    // NaN scales in two panels: the first in row-major block order is reported by both.
    const int64_t per_row = cols / 32, late = (rows - 1) * per_row, early = (rows / 2) * per_row + per_row - 1;
    blocks[size_t(late * kGgmlMxfp4BlockBytes)] = 0xFF;
    blocks[size_t(early * kGgmlMxfp4BlockBytes)] = 0xFF;
    EXPECT_EQ(mxfp4_pack_blocks(blocks.data(), rows, cols, packed.data()), early);
    EXPECT_EQ(mxfp4_blocks_first_nan_scale(blocks.data(), rows * cols / 32), early);
  }
}

TEST(Mxfp4Gemm, DecodeAndPrefillShapesMatchTheDoubleReferenceAndEachOther) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 32}, {37, 64}, {70, 96}, {33, 256}}) {
    const TestMatrix m = random_matrix(rows, cols, unsigned(rows * cols));
    for (const int64_t n : {1, 2, 3, 4, 5, 9, 17}) {
      const std::vector<float> x = test::random_vector(size_t(n * cols), unsigned(n));
      std::vector<float> first;
      for (const Mxfp4Kernel kernel : kernels()) {
        std::vector<float> y(size_t(n * rows), 7.0f);
        const Mxfp4PackedMatrix view = m.view();
        mxfp4_matmul_rows(x.data(), n, cols, {&view, 1}, y.data(), rows, 0.0f, kernel);
        const std::string what = fmt::format("{}x{} n={} kernel {}", rows, cols, n, int(kernel));
        expect_matches_reference(x, n, cols, {&m}, y, rows, 0.0f, std::vector<float>(y.size()), what);
        if (first.empty()) first = y;
        else ASSERT_EQ(y, first) << what << ": the kernels differ";
      }
    }
  }
}

TEST(Mxfp4Gemm, FusedPartsStridesBetaAndExtremeScales) {
  TestMatrix gate = random_matrix(40, 64, 1), up = random_matrix(24, 64, 2);
  // Scale 0 (the subnormal 2^-127) and large scales in some blocks of the first part.
  gate.scales[0] = 0, gate.scales[3] = 0, gate.scales[5] = 200, gate.scales[8] = 60;
  mxfp4_pack(gate.codes.data(), gate.scales.data(), gate.rows, gate.cols, static_cast<uint8_t*>(gate.packed.get()));
  const int64_t n = 6, ld_x = 80, ld_y = 70;
  std::vector<float> x = test::random_vector(size_t(n * ld_x), 5);
  const std::vector<float> before = test::random_vector(size_t(n * ld_y), 6);
  const Mxfp4PackedMatrix parts[2] = {gate.view(), up.view()};
  std::vector<float> first;
  for (const Mxfp4Kernel kernel : kernels()) {
    std::vector<float> y = before;
    mxfp4_matmul_rows(x.data(), n, ld_x, parts, y.data(), ld_y, 0.5f, kernel);
    expect_matches_reference(x, n, ld_x, {&gate, &up}, y, ld_y, 0.5f, before, fmt::format("kernel {}", int(kernel)));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 64; c < ld_y; ++c) ASSERT_EQ(y[size_t(r * ld_y + c)], before[size_t(r * ld_y + c)]) << "past the parts";
    if (first.empty()) first = y;
    else ASSERT_EQ(y, first) << "kernel " << int(kernel) << " differs";
  }
}

// The q8 product: x rounded as the header says (checked here in double), then Σ q·v exact, so the
// only error is f32 rounding in the scale products and the sum over blocks; native and portable
// kernels bit for bit alike.
TEST(Mxfp4Gemm, Q8ProductMatchesItsDoubleReference) {
  const TestMatrix gate = random_matrix(40, 96, 7), up = random_matrix(24, 96, 8);
  const Mxfp4PackedMatrix parts[2] = {gate.view(), up.view()};
  for (const int64_t n : {1, 3, 4, 5, 9}) {
    const int64_t ld_x = 100, ld_y = 70;
    std::vector<float> x = test::random_vector(size_t(n * ld_x), unsigned(n) + 20);
    for (int64_t r = 0; r < n; ++r) x[size_t(r * ld_x + 5 * r)] *= 30.0f;  // an outlier per row
    const std::vector<float> before = test::random_vector(size_t(n * ld_y), 9);
    const auto workspace = allocate_aligned(size_t(mxfp4_q8_rows_bytes(n, 96)));
    std::vector<float> first;
    for (const Mxfp4Kernel kernel : {Mxfp4Kernel::Native, Mxfp4Kernel::Portable}) {
      std::vector<float> y = before;
      mxfp4_matmul_rows_q8(x.data(), n, ld_x, parts, y.data(), ld_y, 1.0f, workspace.get(), kernel);
      int64_t column = 0;
      for (const TestMatrix* m : {&gate, &up}) {
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < m->rows; ++j) {
            double sum = 0, magnitude = 0;
            for (int64_t b = 0; b < 3; ++b) {
              const float* xb = x.data() + r * ld_x + 32 * b;
              float max_abs = 0;
              for (int k = 0; k < 32; ++k) max_abs = std::max(max_abs, std::fabs(xb[k]));
              const float s_x = max_abs / 127.0f, inv = max_abs > 0 ? 127.0f / max_abs : 0.0f;
              for (int k = 0; k < 32; ++k) {
                const double term = double(s_x) * std::nearbyint(double(xb[k] * inv)) * m->weight(j, 32 * b + k);
                sum += term, magnitude += std::fabs(term);
              }
            }
            const double ref = sum + before[size_t(r * ld_y + column + j)];
            ASSERT_NEAR(y[size_t(r * ld_y + column + j)], ref, 6 * 0x1p-23 * magnitude + 0x1p-22 * std::fabs(ref))
                << "n " << n << " row " << r << " output " << column + j;
          }
        column += m->rows;
      }
      if (first.empty()) first = y;
      else ASSERT_EQ(y, first) << "n " << n << ": native and portable differ";
    }
  }
}

// nano.json (expert input 64, width 32), experts randomised: the f32 model, its MXFP4-expert copy
// (hyla quantize --experts mxfp4 --only-experts) and the f32 model holding the MXFP4 experts'
// dequantised values.
class Mxfp4Models {
 public:
  Mxfp4Models() {
    config_ = test::nano_config([](nlohmann::json& j) { j["moe"]["num_experts"] = 16; });
    Model model(config_);
    model.initialize(3);
    test::randomize_params(model.params(), 4);
    model.save(dir_ / "f32");
    QuantizeOptions options;
    options.experts = ExpertFormat::Mxfp4;
    options.only_experts = true;
    const QuantizeSummary summary = quantize_model(dir_ / "f32", dir_ / "mxfp4", options);
    EXPECT_EQ(summary.int8_tensors, 0);
    EXPECT_EQ(summary.mxfp4_tensors, 3 * 16 * 3);  // 3 MoE layers × 16 experts × gate, up, down
    const ModelWeights mx(dir_ / "mxfp4");
    for (const auto& p : model.params().params()) {
      if (p->component != Component::RoutedExperts) continue;
      const Tensor codes = mx.get(p->name), scales = mx.get(mxfp4_scale_name(p->name));
      const int64_t cols = p->shape[1];
      for (int64_t i = 0; i < p->numel(); ++i) {
        const uint8_t byte = codes.data<uint8_t>()[i / 2];
        p->v()[i] = mxfp4_value(i % 2 ? byte >> 4 : byte & 15, scales.data<uint8_t>()[(i / cols) * (cols / 32) + (i % cols) / 32]);
      }
    }
    model.save(dir_ / "dequantised");
  }
  fs::path dir(const std::string& name) const { return dir_ / name; }
  const ModelConfig& config() const { return config_; }

 private:
  test::TempDir dir_;
  ModelConfig config_;
};

const Mxfp4Models& mxfp4_models() {
  static const Mxfp4Models models;
  return models;
}

TEST(Mxfp4Model, F32LogitsAreTheDequantisedModelsAndBf16StaysClose) {
  const Mxfp4Models& m = mxfp4_models();
  const auto mxfp4 = Model::load(m.dir("mxfp4"));
  const auto dequantised = Model::load(m.dir("dequantised"));
  const auto original = Model::load(m.dir("f32"));
  EXPECT_TRUE(mxfp4->params().get("model.layers.1.mlp.experts.3.down_proj.weight").is_mxfp4());
  EXPECT_FALSE(mxfp4->params().get("model.layers.1.mlp.shared_experts.down_proj.weight").is_quantized());
  EXPECT_FALSE(mxfp4->params().get("lm_head.weight").is_quantized());
  const ModelInput in = test::random_input(m.config(), {20, 17, 9}, 5);
  const ForwardOptions f32{.precision = Precision::F32, .outputs = Outputs::All};
  const Tensor exact = dequantised->forward(in, f32).logits;
  // The same weights in f32: only the experts' sums run in another order (a few ulp; routing
  // flips would show as O(1) differences).
  EXPECT_LT(test::max_relative_difference(exact, mxfp4->forward(in, f32).logits), 1e-5);
  // Against the unquantised model: MXFP4's rounding (up to a quarter of a value's magnitude).
  const double quantisation = test::max_relative_difference(original->forward(in, f32).logits, exact);
  EXPECT_GT(quantisation, 1e-4);
  EXPECT_LT(quantisation, 0.3);
  // bf16 products for the rest (the experts' activations rounded to 8 bits per 32): as close to
  // the f32 logits as the float model's bf16 run (measured 2.5e-2 on these random weights).
  const double bf16_error = test::max_relative_difference(
      exact, dequantised->forward(in, {.precision = Precision::BF16, .outputs = Outputs::All}).logits);
  EXPECT_LT(test::max_relative_difference(exact, mxfp4->forward(in, {.precision = Precision::BF16, .outputs = Outputs::All}).logits),
            2 * bf16_error);
  try {
    mxfp4->forward(in, {.precision = Precision::F32, .outputs = Outputs::None, .backward = true});
    FAIL() << "an MXFP4 model trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("serve inference only"), std::string::npos) << e.what();
  }
}

TEST(Mxfp4Model, OffloadedExpertsGiveTheResidentLogitsBitForBit) {
  const Mxfp4Models& m = mxfp4_models();
  const auto resident = Model::load(m.dir("mxfp4"));
  const int64_t V = m.config().vocab_size;
  const auto run = [&](Model& model) {
    SequenceState state(model, 64);
    std::vector<float> out;
    std::mt19937 rng(9);
    std::vector<int32_t> prompt(20);
    for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(V));
    for (int64_t i = 0; i < 20; i += 5) {
      const Tensor logits = feed(model, {prompt.begin() + i, prompt.begin() + i + 5}, state, 5, Precision::BF16);
      out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    }
    return out;
  };
  const std::vector<float> expected = run(*resident);
  for (const bool prefetch : {false, true}) {
    const auto offloaded = Model::load(
        m.dir("mxfp4"), {.offload_experts = ExpertOffloadOptions{parse_expert_memory("25%"), ExpertCachePolicy::Lru, prefetch}});
    EXPECT_EQ(run(*offloaded), expected) << (prefetch ? "prefetch" : "no prefetch");
    const ExpertOffloadStats stats = offloaded->expert_offload()->stats();
    EXPECT_GT(stats.total().fetches, 0);
    // An expert's packed bytes: gate and up [32, 64] and down [64, 32] at 4.25 bits a weight.
    EXPECT_EQ(offloaded->expert_offload()->expert_bytes(), 3 * 32 * 64 * 17 / 32);
  }
}

TEST(Mxfp4Model, QuantizeInspectAndEvalCommands) {
  const Mxfp4Models& m = mxfp4_models();
  const fs::path out = m.dir("cli");
  const test::CommandResult q =
      test::run_hyla(fmt::format("quantize -m {} --out {} --experts mxfp4", m.dir("f32").string(), out.string()));
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_NE(q.output.find("as int8 with block 32"), std::string::npos) << q.output;
  EXPECT_NE(q.output.find("144 routed-expert weights"), std::string::npos) << q.output;
  const test::CommandResult inspect = test::run_hyla("inspect " + out.string());
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("mxfp4: 144 routed-expert matrices"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("int8: "), std::string::npos) << inspect.output;
  const test::CommandResult bad = test::run_hyla(
      fmt::format("quantize -m {} --out {} --experts mxfp8", m.dir("f32").string(), m.dir("bad").string()));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--experts"), std::string::npos) << bad.output;
}

TEST(Mxfp4Model, MalformedTensorsFailWithOneLineErrors) {
  const Mxfp4Models& m = mxfp4_models();
  const std::string expert = "model.layers.1.mlp.experts.2.gate_proj.weight";
  const auto rewrite = [&](const std::string& name, const std::function<void(NamedTensors&)>& edit) {
    const fs::path dir = m.dir(name);
    fs::create_directories(dir);
    fs::copy_file(m.dir("mxfp4") / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
    const ModelWeights weights(m.dir("mxfp4"));
    NamedTensors tensors;
    for (const std::string& n : weights.names()) tensors.emplace_back(n, weights.get(n).clone());
    edit(tensors);
    save_safetensors(dir / "model.safetensors", tensors);
    return dir;
  };
  const auto find = [](NamedTensors& t, const std::string& name) -> Tensor& {
    for (auto& [n, tensor] : t)
      if (n == name) return tensor;
    throw std::runtime_error("no " + name);
  };
  const auto expect_error = [](const fs::path& dir, const std::vector<std::string>& parts) {
    try {
      const auto model = Model::load(dir);
      ADD_FAILURE() << dir << " loaded";
    } catch (const Error& e) {
      const std::string what = e.what();
      for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  expect_error(rewrite("nan-scale", [&](NamedTensors& t) { find(t, expert + ".scale").data<uint8_t>()[3] = 0xFF; }),
               {expert + ".scale", "NaN", "index 3"});
  expect_error(rewrite("no-scale",
                       [&](NamedTensors& t) {
                         std::erase_if(t, [&](const auto& e) { return e.first == expert + ".scale"; });
                       }),
               {expert + ".scale", "missing"});
  expect_error(rewrite("wrong-shape", [&](NamedTensors& t) { find(t, expert) = Tensor::zeros(DType::U8, {32, 64}); }),
               {expert, "[32, 32]"});
  // Only routed experts may be MXFP4.
  const std::string shared = "model.layers.1.mlp.shared_experts.gate_proj.weight";
  expect_error(rewrite("shared", [&](NamedTensors& t) { find(t, shared) = Tensor::zeros(DType::U8, {32, 32}); }),
               {shared, "only routed experts"});
  // A fused pair stored unalike.
  const std::string up = "model.layers.1.mlp.experts.2.up_proj.weight";
  expect_error(rewrite("unalike",
                       [&](NamedTensors& t) {
                         find(t, up) = Tensor::zeros(DType::F32, {32, 64});
                         std::erase_if(t, [&](const auto& e) { return e.first == up + ".scale"; });
                       }),
               {expert, up, "stored alike"});
}

}  // namespace
}  // namespace hyla
