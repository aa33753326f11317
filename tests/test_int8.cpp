// int8 weights (docs/quantization.md): the kernels against double references (exact integer sums;
// the quantisation error inside its bound), decode/prefill/odd shapes, fused parts, the portable
// kernels; hyla quantize → Model::load → logits, cached decode, perplexity after a short training
// run; malformed int8 directories; hyla inspect and hyla eval on them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "hyla/core/memory.h"
#include "hyla/infer/sequence_state.h"
#include "hyla/io/safetensors.h"
#include "hyla/kernels/int8_gemm.h"
#include "hyla/model/int8_weights.h"
#include "hyla/model/model.h"
#include "hyla/quant/quantize_model.h"
#include "hyla/train/optimizer.h"
#include "model_test_util.h"

namespace hyla {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A packed int8 matrix with its row-major values and scales (what a file holds).
struct TestMatrix {
  int64_t rows, cols, block;
  std::vector<int8_t> values;
  std::vector<float> scales;
  std::shared_ptr<void> packed;
  Int8PackedMatrix view() const { return {static_cast<const uint8_t*>(packed.get()), rows, cols, block}; }
};

TestMatrix pack(int64_t rows, int64_t cols, int64_t block, std::vector<int8_t> values, std::vector<float> scales) {
  TestMatrix m{rows, cols, block, std::move(values), std::move(scales), allocate_aligned(size_t(int8_packed_bytes(rows, cols, block)))};
  int8_pack(m.values.data(), m.scales.data(), rows, cols, block, static_cast<uint8_t*>(m.packed.get()));
  return m;
}

TestMatrix quantized_random(int64_t rows, int64_t cols, int64_t block, unsigned seed) {
  const std::vector<float> w = test::random_vector(size_t(rows * cols), seed, 0.05f);
  std::vector<int8_t> values(size_t(rows * cols));
  std::vector<float> scales(size_t(rows * cols / block));
  quantize_int8_weights(w.data(), rows, cols, block, values.data(), scales.data());
  return pack(rows, cols, block, std::move(values), std::move(scales));
}

// Activations with a few outlier channels, as LLM activations have.
std::vector<float> activations(int64_t n, int64_t cols, unsigned seed) {
  std::vector<float> x = test::random_vector(size_t(n * cols), seed);
  for (int64_t r = 0; r < n; ++r) x[size_t(r * cols + (7 * r) % cols)] *= 20.0f;
  return x;
}

struct Quantized {
  std::shared_ptr<void> memory;
  Int8Rows rows;
};
Quantized quantize(const std::vector<float>& x, int64_t n, int64_t cols, int64_t block, Int8Kernel kernel) {
  Quantized q{allocate_aligned(size_t(std::max<int64_t>(int8_rows_bytes(n, cols, block), 64))), {}};
  q.rows = int8_rows_view(q.memory.get(), n, cols, block);
  quantize_int8_rows(x.data(), cols, q.rows, 0, n, kernel);
  return q;
}

// Σ over blocks of s_w s_x Σ q_w q_x in double, and Σ over the kernels' steps (int8_step columns)
// of |s_w s_x Σ q_w q_x|, the scale of their f32 rounding error, for output (row r of x, row j of m).
std::pair<double, double> reference(const Int8Rows& x, int64_t r, const TestMatrix& m, int64_t j) {
  const int64_t step = int8_step(m.block);
  double total = 0, magnitude = 0;
  for (int64_t k0 = 0; k0 < m.cols; k0 += step) {
    int64_t sum = 0;
    for (int64_t k = k0; k < k0 + step; ++k) sum += int64_t(m.values[size_t(j * m.cols + k)]) * x.values[r * x.cols + k];
    const double term =
        double(m.scales[size_t(j * m.cols / m.block + k0 / m.block)]) * x.scales[r * (x.cols / x.block) + k0 / m.block] * double(sum);
    total += term;
    magnitude += std::fabs(term);
  }
  return {total, magnitude};
}

// Checks y (n rows, stride ld_y) = x · [parts]ᵀ + before against the double reference: each
// step's integer sum is exact, so the only error is f32 rounding in the scale products and the
// sums over steps, ≤ (steps + 2) ulp of their magnitudes, and in adding `before` (beta = 1).
void expect_matches_reference(const Int8Rows& x, const std::vector<const TestMatrix*>& parts, const float* y,
                              int64_t ld_y, const std::string& what, const float* before = nullptr) {
  const int64_t steps = x.cols / int8_step(x.block);
  int64_t column = 0;
  for (const TestMatrix* m : parts) {
    for (int64_t r = 0; r < x.rows; ++r)
      for (int64_t j = 0; j < m->rows; ++j) {
        const auto [product, magnitude] = reference(x, r, *m, j);
        const double add = before ? before[r * ld_y + column + j] : 0.0, ref = product + add;
        ASSERT_NEAR(y[r * ld_y + column + j], ref, double(steps + 2) * 0x1p-23 * magnitude + 0x1p-23 * std::fabs(ref))
            << what << " row " << r << " output " << column + j;
      }
    column += m->rows;
  }
}

TEST(Int8Gemm, IntegerSumsAreExact) {
  // Unit scales and integer activations whose blocks reach ±127: the product is Σ q_w q_x exactly.
  for (const int64_t block : {16, 32, 64, 256}) {
    const int64_t rows = 37, cols = 512;
    std::mt19937 rng(block);
    std::uniform_int_distribution<int> value(-127, 127);
    std::vector<int8_t> w(size_t(rows * cols));
    for (int8_t& v : w) v = int8_t(value(rng));
    const TestMatrix m = pack(rows, cols, block, w, std::vector<float>(size_t(rows * cols / block), 1.0f));
    for (const int64_t n : {1, 5, 16}) {
      std::vector<float> x(size_t(n * cols));
      for (int64_t i = 0; i < n * cols; ++i) x[size_t(i)] = i % block == 0 ? (i % 3 ? 127.0f : -127.0f) : float(value(rng));
      for (const Int8Kernel kernel : {Int8Kernel::Native, Int8Kernel::Portable}) {
        const Quantized q = quantize(x, n, cols, block, kernel);
        std::vector<float> y(size_t(n * rows));
        const Int8PackedMatrix view = m.view();
        int8_matmul_rows(q.rows, {&view, 1}, y.data(), rows, 0.0f, kernel);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < rows; ++j) {
            int64_t exact = 0;
            for (int64_t k = 0; k < cols; ++k) exact += int64_t(w[size_t(j * cols + k)]) * int64_t(x[size_t(r * cols + k)]);
            ASSERT_EQ(y[size_t(r * rows + j)], float(exact)) << "block " << block << " n " << n << " row " << r;
          }
      }
    }
  }
}

TEST(Int8Gemm, QuantisationIsRoundToNearestEvenAndTheSameInBothKernels) {
  // max|x| = 127 makes the scale 1, so x itself is rounded: ties go to the even neighbour.
  std::vector<float> x(32, 0.0f);
  const float values[] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 3.49f, -126.6f};
  std::copy(std::begin(values), std::end(values), x.begin());
  const Quantized q = quantize(x, 1, 32, 32, Int8Kernel::Native);
  const int8_t expected[] = {127, 0, 2, 2, 0, -2, 3, -127};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.rows.values[i], expected[i]) << i;
  EXPECT_EQ(q.rows.scales[0], 1.0f);
  EXPECT_EQ(q.rows.starts[0], -128 * (127 + 2 + 2 - 2 + 3 - 127));

  for (const int64_t block : {16, 32, 128}) {
    const int64_t n = 9, cols = 256;
    const std::vector<float> a = activations(n, cols, unsigned(block));
    const Quantized native = quantize(a, n, cols, block, Int8Kernel::Native);
    const Quantized portable = quantize(a, n, cols, block, Int8Kernel::Portable);
    EXPECT_EQ(std::memcmp(native.rows.values, portable.rows.values, size_t(n * cols)), 0);
    EXPECT_EQ(std::memcmp(native.rows.scales, portable.rows.scales, size_t(n * cols / block) * 4), 0);
    EXPECT_EQ(std::memcmp(native.rows.starts, portable.rows.starts, size_t(n * cols / int8_step(block)) * 4), 0);
    for (int64_t i = 0; i < n * cols; ++i) {
      const float scale = native.rows.scales[i / cols * (cols / block) + i % cols / block];
      ASSERT_LE(std::fabs(a[size_t(i)] - scale * native.rows.values[i]), (0.5f + 127 * 1e-6f) * scale) << i;
    }
  }
}

TEST(Int8Gemm, DecodeAndPrefillShapesMatchTheDoubleReference) {
  struct Case {
    int64_t n, rows, cols, block;
  };
  // Decode (1-16 rows of x), prefill (many rows, several row chunks), rows that leave partial
  // panels and partial tiles, every block size.
  const Case cases[] = {{1, 8, 64, 32},     {1, 257, 512, 32},  {3, 40, 96, 32},   {4, 48, 128, 16},
                        {5, 17, 256, 64},   {16, 100, 512, 32}, {67, 33, 512, 256}, {600, 50, 512, 32},
                        {130, 129, 1408, 32}};
  for (const Case& c : cases) {
    const std::string what = fmt::format("n={} rows={} cols={} block={}", c.n, c.rows, c.cols, c.block);
    const TestMatrix m = quantized_random(c.rows, c.cols, c.block, unsigned(c.rows));
    const Int8PackedMatrix view = m.view();
    const std::vector<float> x = activations(c.n, c.cols, unsigned(c.n));
    const Quantized q = quantize(x, c.n, c.cols, c.block, Int8Kernel::Portable);
    std::vector<float> serial(size_t(c.n * c.rows)), threaded(serial.size()), portable(serial.size());
    int8_matmul_rows(q.rows, {&view, 1}, serial.data(), c.rows, 0.0f);
    int8_matmul_rows(q.rows, {&view, 1}, portable.data(), c.rows, 0.0f, Int8Kernel::Portable);
    const auto workspace = allocate_aligned(size_t(int8_rows_bytes(c.n, c.cols, c.block)));
    int8_matmul(x.data(), c.n, c.cols, {&view, 1}, threaded.data(), c.rows, 0.0f, workspace.get());
    expect_matches_reference(q.rows, {&m}, serial.data(), c.rows, what);
    expect_matches_reference(q.rows, {&m}, portable.data(), c.rows, what + " portable");
    // Every output's arithmetic is the same however threads split the panels.
    EXPECT_EQ(std::memcmp(serial.data(), threaded.data(), serial.size() * 4), 0) << what;

    // Against the f32 product: |x·w − x̂·ŵ| ≤ Σ_k |x_k| e_w + |ŵ_k| e_x, e = scale / 2 per block.
    const std::vector<float> original = test::random_vector(size_t(c.rows * c.cols), unsigned(c.rows), 0.05f);
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t j = 0; j < c.rows; ++j) {
        double exact = 0, bound = 0, magnitude = 0;
        for (int64_t k = 0; k < c.cols; ++k) {
          const double xk = x[size_t(r * c.cols + k)], wk = original[size_t(j * c.cols + k)];
          const double ew = 0.5 * m.scales[size_t((j * c.cols + k) / c.block)];
          const double ex = 0.5 * q.rows.scales[r * (c.cols / c.block) + k / c.block];
          exact += xk * wk;
          bound += std::fabs(xk) * ew + (std::fabs(wk) + ew) * ex;
          magnitude += std::fabs(xk * wk);
        }
        // (plus the f32 rounding of the scales and of the kernel's sums)
        ASSERT_LE(std::fabs(serial[size_t(r * c.rows + j)] - exact), bound + 1e-5 * magnitude) << what;
      }
  }
}

TEST(Int8Gemm, FusedPartsStridesAndBeta) {
  // [40; 8; 24] rows stacked as one product (KDA's fused projections end in a narrow part), into
  // an output wider than the product, accumulating onto what is there.
  const int64_t n = 7, cols = 128, block = 32, ld_y = 80;
  const TestMatrix a = quantized_random(40, cols, block, 1), b = quantized_random(8, cols, block, 2),
                   c = quantized_random(24, cols, block, 3);
  const Int8PackedMatrix parts[] = {a.view(), b.view(), c.view()};
  const std::vector<float> x = activations(n, cols + 3, 4);  // rows cols + 3 apart
  std::vector<float> y(size_t(n * ld_y)), before;
  for (size_t i = 0; i < y.size(); ++i) y[i] = float(i % 13);
  before = y;
  const auto workspace = allocate_aligned(size_t(int8_rows_bytes(n, cols, block)));
  int8_matmul(x.data(), n, cols + 3, parts, y.data(), ld_y, 1.0f, workspace.get());
  Quantized q{allocate_aligned(size_t(int8_rows_bytes(n, cols, block))), {}};
  q.rows = int8_rows_view(q.memory.get(), n, cols, block);
  quantize_int8_rows(x.data(), cols + 3, q.rows, 0, n);
  expect_matches_reference(q.rows, {&a, &b, &c}, y.data(), ld_y, "fused", before.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 72; j < ld_y; ++j) EXPECT_EQ(y[size_t(r * ld_y + j)], before[size_t(r * ld_y + j)]);
}

// A model directory and the same model quantised.
struct QuantizedPair {
  test::TempDir dir;
  fs::path f32() const { return dir / "f32"; }
  fs::path int8() const { return dir / "int8"; }
};

void make_pair(QuantizedPair& pair, const ModelConfig& config, unsigned seed, int64_t block = 32) {
  Model model(config);
  model.initialize(seed);
  model.save(pair.f32());
  QuantizeOptions options;
  options.block = block;
  quantize_model(pair.f32(), pair.int8(), options);
}

// Every projection of the int8 model quantises its weights and its inputs with errors of at most
// half a step, scale / 2 = max|·| / 254 per block (rms ≈ max / 440, ~0.5% of a Gaussian block's
// rms each, against bf16's 2^-9 ≈ 0.2% rounding of inputs only). The nano model chains ~20
// products, so the logits move by a few 1e-2 of their scale at most: measured 1.4e-2 against the
// f32 model with SPEC's init (bf16 products: 4.0e-3), 2.2e-2 under f32 products for the rest (the
// activations' rounding is discontinuous: upstream differences of one ulp flip roundings, so two
// int8 runs differ by up to the quantisation noise itself). Bound 5e-2.
TEST(Int8Model, LogitsStayCloseToTheFloatModel) {
  QuantizedPair pair;
  const ModelConfig config = test::nano_config();
  make_pair(pair, config, 7);
  const auto f32 = Model::load(pair.f32());
  const auto int8 = Model::load(pair.int8());
  EXPECT_TRUE(int8->params().has_quantized());
  EXPECT_TRUE(int8->params().get("lm_head.weight").is_int8());
  EXPECT_FALSE(int8->params().get("model.layers.1.self_attn.kv_b_proj.weight").is_int8());
  EXPECT_FALSE(int8->params().get("model.layers.1.mlp.gate.weight").is_int8());
  const ModelInput in = test::random_input(config, {20, 5}, 4);
  const Tensor reference = f32->forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
  for (const Precision p : {Precision::BF16, Precision::F32}) {
    const double error = test::max_relative_difference(reference, int8->forward(in, {.precision = p, .outputs = Outputs::All}).logits);
    EXPECT_LT(error, 5e-2);
    EXPECT_GT(error, 0.0);
  }
  // The loss agrees too, and training is refused.
  const double loss_f32 = f32->forward(in, {.precision = Precision::F32, .outputs = Outputs::None}).loss.loss, loss_int8 = int8->forward(in, {.precision = Precision::BF16, .outputs = Outputs::None}).loss.loss;
  EXPECT_NEAR(loss_int8, loss_f32, 1e-2 * loss_f32);
  try {
    int8->forward(in, {.precision = Precision::BF16, .outputs = Outputs::None, .backward = true}).loss;
    FAIL() << "an int8 model trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("serve inference only"), std::string::npos) << e.what();
  }
  EXPECT_THROW(int8->save(pair.dir / "again"), Error);
}

TEST(Int8Model, CachedDecodeMatchesTheFullForward) {
  QuantizedPair pair;
  const ModelConfig config = test::nano_config();
  make_pair(pair, config, 9);
  const auto model = Model::load(pair.int8());
  const ModelInput full = test::random_input(config, {11}, 2);
  const Tensor logits = model->forward(full, {.precision = Precision::BF16, .outputs = Outputs::All}).logits;

  // One sequence's caches, f32 latents; prefill 8 tokens, then decode 3 one by one.
  SequenceState state(*model, 16, DType::F32);
  SequenceCache& cache = state.cache();
  const auto step = [&](int64_t from, int64_t count) {
    ModelInput in;
    in.tokens = TokenBatch::packed({count}, {from});
    in.ids.assign(full.ids.begin() + from, full.ids.begin() + from + count);
    return model->forward(in, {.precision = Precision::BF16}, {&cache, 1}).logits;
  };
  const int64_t V = config.vocab_size;
  for (int64_t t = 7; t < 11; ++t) {
    const Tensor last = t == 7 ? step(0, 8) : step(t, 1);
    double diff = 0, scale = 0;
    for (int64_t j = 0; j < V; ++j) {
      diff = std::max(diff, double(std::fabs(last.data<float>()[j] - logits.data<float>()[t * V + j])));
      scale = std::max(scale, double(std::fabs(logits.data<float>()[t * V + j])));
    }
    // Chunked and recurrent paths differ by float rounding, which the int8 rounding of activations
    // can turn into up to the quantisation noise (see LogitsStayCloseToTheFloatModel): measured
    // 5e-3; a broken decode path would be off by O(1).
    EXPECT_LT(diff / scale, 3e-2) << "position " << t;
  }
}

// A copy of an int8 directory with its tensors or metadata edited.
void rewrite(const fs::path& from, const fs::path& to,
             const std::function<void(NamedTensors&, std::map<std::string, std::string>&)>& edit) {
  fs::create_directories(to);
  fs::copy_file(from / "config.json", to / "config.json", fs::copy_options::overwrite_existing);
  const ModelWeights weights(from);
  NamedTensors tensors;
  for (const std::string& name : weights.names()) tensors.emplace_back(name, weights.get(name).clone());
  std::map<std::string, std::string> metadata = weights.files()[0].header().metadata;
  edit(tensors, metadata);
  save_model_weights(to, tensors, uint64_t(4) << 30, metadata);
}

Tensor& tensor_named(NamedTensors& tensors, const std::string& name) {
  for (auto& [n, t] : tensors)
    if (n == name) return t;
  throw Error("no tensor " + name);
}

TEST(Int8Model, MalformedDirectoriesFailWithOneLineErrors) {
  QuantizedPair pair, block64;
  const ModelConfig config = test::nano_config();
  make_pair(pair, config, 3);
  make_pair(block64, config, 3, 64);
  const std::string q = "model.layers.0.self_attn.q_proj.weight", norm = "model.layers.0.input_layernorm.weight";
  const std::string o = "model.layers.0.self_attn.o_proj.weight";
  struct Case {
    std::function<void(NamedTensors&, std::map<std::string, std::string>&)> edit;
    std::string error;
    fs::path source;
    bool inspect_fails = true;  // inspect checks names, dtypes and shapes, not values
  };
  const std::vector<Case> cases = {
      {[&](NamedTensors& t, auto&) { std::erase_if(t, [&](auto& e) { return e.first == q + ".scale"; }); },
       "missing tensor '" + q + ".scale' (the scales of int8 tensor '" + q + "')", pair.int8()},
      {[&](NamedTensors& t, auto&) { tensor_named(t, q + ".scale") = Tensor::zeros(DType::F32, {32, 4}); },
       "has shape [32, 4] but int8 tensor '" + q + "' [32, 64] with block 32 needs [32, 2]", pair.int8()},
      {[&](NamedTensors& t, auto&) { tensor_named(t, q + ".scale") = tensor_named(t, q + ".scale").to(DType::BF16); },
       "int8 scales must be F32", pair.int8()},
      {[&](NamedTensors& t, auto&) { tensor_named(t, norm) = Tensor::zeros(DType::I8, {64}); },
       "tensor '" + norm + "' is I8, but only matrix-product weights may be int8", pair.int8()},
      {[&](NamedTensors& t, auto&) {
         tensor_named(t, "model.layers.1.self_attn.kv_b_proj.weight") = Tensor::zeros(DType::I8, {64, 32});
       },
       "kv_b_proj.weight' is I8, but only matrix-product weights may be int8", pair.int8()},
      {[&](NamedTensors& t, auto&) { t.emplace_back(norm + ".scale", Tensor::zeros(DType::F32, {64})); },
       "tensor '" + norm + ".scale' is not a parameter of this config (it would scale '" + norm + "', which is neither I8 nor MXFP4)",
       pair.int8()},
      {[&](NamedTensors&, auto& m) { m.clear(); }, "holds I8 tensors but its __metadata__ lacks \"quantization\": \"int8\"",
       pair.int8()},
      {[&](NamedTensors&, auto& m) { m["block"] = "24"; }, "__metadata__ block '24' is not one of 16, 32, 64, 128, 256",
       pair.int8()},
      {[&](NamedTensors& t, auto&) {
         // The block-64 directory kept o_proj (32 inputs) in f32; an I8 o_proj cannot have block 64.
         tensor_named(t, o) = Tensor::zeros(DType::I8, {64, 32});
         t.emplace_back(o + ".scale", Tensor::zeros(DType::F32, {64, 0}));
       },
       "int8 tensor '" + o + "' has 32 input features, not a multiple of the block 64", block64.int8()},
      {[&](NamedTensors& t, auto&) { tensor_named(t, q + ".scale").data<float>()[3] = NAN; },
       "tensor '" + q + ".scale' holds nan at index 3; int8 scales are finite and >= 0", pair.int8(), false},
      {[&](NamedTensors& t, auto&) {
         // k_proj back to floating point while q_proj, fused with it, stays int8.
         const std::string k = "model.layers.0.self_attn.k_proj.weight";
         std::erase_if(t, [&](auto& e) { return e.first == k + ".scale"; });
         tensor_named(t, k) = Tensor::zeros(DType::F32, {32, 64});
       },
       "tensors '" + q + "' and 'model.layers.0.self_attn.k_proj.weight' run in one kernel and must be stored "
       "alike, but one is I8 and the other floating point",
       pair.int8()},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path dir = pair.dir / ("bad" + std::to_string(i));
    rewrite(cases[i].source, dir, cases[i].edit);
    try {
      Model::load(dir);
      ADD_FAILURE() << "loaded: " << cases[i].error;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(cases[i].error), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
    if (!cases[i].inspect_fails) continue;
    const auto r = test::run_hyla("inspect " + dir.string());
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("error: " + dir.string()), std::string::npos) << r.output;
  }
}

TEST(Int8Model, QuantizeInspectAndEvalCommands) {
  test::TempDir dir;
  const std::string f32 = (dir / "f32").string(), int8 = (dir / "int8").string();
  ASSERT_EQ(test::run_hyla("init --config " + (test::source_dir() / "configs/nano.json").string() + " --out " + f32 +
                           " --seed 5").exit_code, 0);
  auto r = test::run_hyla("quantize --model " + f32 + " --out " + int8 + " --weight-dtype int8 --block 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 32-wide inputs (expert down projections, o_proj) are not a multiple of 64: kept, and said so.
  EXPECT_NE(r.output.find("kept floating point: model.layers.0.self_attn.o_proj.weight (32 input features are not a "
                          "multiple of the block 64)"),
            std::string::npos)
      << r.output;
  const ModelWeights weights(int8);
  EXPECT_EQ(weights.files()[0].header().metadata.at("quantization"), "int8");
  EXPECT_EQ(weights.files()[0].header().metadata.at("block"), "64");
  EXPECT_EQ(weights.entry("model.layers.0.self_attn.q_proj.weight").dtype, DType::I8);
  EXPECT_EQ(weights.entry("model.layers.0.self_attn.q_proj.weight.scale").shape, (Shape{32, 1}));
  EXPECT_EQ(weights.entry("model.layers.0.self_attn.o_proj.weight").dtype, DType::F32);
  EXPECT_EQ(weights.entry("model.embed_tokens.weight").dtype, DType::F32);
  EXPECT_TRUE(fs::exists(fs::path(int8) / "config.json"));

  r = test::run_hyla("inspect " + int8);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("with one F32 scale per 64 inputs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ok: weights match config.json"), std::string::npos) << r.output;

  EXPECT_EQ(test::run_hyla("quantize --model " + int8 + " --out " + (dir / "twice").string()).exit_code, 1);
  r = test::run_hyla("quantize --model " + f32 + " --out " + (dir / "x").string() + " --block 48");
  EXPECT_NE(r.output.find("--block 48 is not one of 16, 32, 64, 128, 256"), std::string::npos) << r.output;
  EXPECT_EQ(test::run_hyla("quantize --model " + f32 + " --out " + f32).exit_code, 1);
}

// The int8 model of a briefly trained nano model (a few dozen AdamW steps on a noisy modular
// sequence, loss well below uniform) has the bf16 model's validation perplexity within 1%.
TEST(Int8Model, PerplexityAfterTrainingStaysWithinOnePercentOfBf16) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  model.initialize(1);
  const OptimizerConfig adamw{.lr = 1e-2};
  AdamW optimizer(model.params(), adamw);
  const auto sequences = [&](unsigned seed, int64_t count, int64_t length) {
    std::mt19937 rng(seed);
    ModelInput in;
    in.tokens = TokenBatch::uniform(count, length);
    for (int64_t s = 0; s < count; ++s) {
      int32_t t = int32_t(rng() % 64);
      for (int64_t i = 0; i <= length; ++i) {
        if (i > 0) in.targets.push_back(t);
        if (i < length) in.ids.push_back(t);
        t = rng() % 5 == 0 ? int32_t(rng() % 64) : (3 * t + 7) % 64;
      }
    }
    return in;
  };
  double loss = 0;
  for (int step = 0; step < 40; ++step) {
    model.params().zero_grads();
    loss = model.forward(sequences(100 + step, 8, 32), {.precision = Precision::BF16, .outputs = Outputs::None, .backward = true}).loss.loss;
    model.update_balancing();
    optimizer.step(adamw.lr, 1.0f);
  }
  EXPECT_LT(loss, 0.6 * std::log(64.0));

  test::TempDir dir;
  model.save(dir / "f32");
  quantize_model(dir / "f32", dir / "int8", {});
  const auto int8 = Model::load(dir / "int8");
  const ModelInput val = sequences(7, 16, 64);
  const double bf16_ppl = std::exp(model.forward(val, {.precision = Precision::BF16, .outputs = Outputs::None}).loss.loss);
  const double int8_ppl = std::exp(int8->forward(val, {.precision = Precision::BF16, .outputs = Outputs::None}).loss.loss);
  EXPECT_NEAR(int8_ppl / bf16_ppl, 1.0, 0.01) << "bf16 " << bf16_ppl << " int8 " << int8_ppl;
}

}  // namespace
}  // namespace hyla
