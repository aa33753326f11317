// The whole model (SPEC §2–§9): logits against the plain double-precision SPEC evaluation in
// spec_reference.cpp, gradients of every parameter kind against central differences of that
// evaluation, save/load round trips (f32, bf16, f16), `hyla logits`, bf16 matmul inputs, and the
// cached forward (prefill in chunks, then decode) against the full forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "hyla/io/safetensors.h"
#include "hyla/model/model.h"
#include "model_test_util.h"
#include "spec_reference.h"

namespace hyla {
namespace {

using json = nlohmann::json;

test::ParamValues values_of(const Model& m) {
  test::ParamValues v;
  for (const auto& p : m.params().params()) v[p->name].assign(p->value.data<float>(), p->value.data<float>() + p->numel());
  return v;
}

ModelInput random_input(const ModelConfig& c, const std::vector<int64_t>& lengths, unsigned seed) {
  ModelInput in;
  in.tokens = TokenBatch::packed(lengths);
  std::mt19937 rng(seed);
  for (int64_t r = 0; r < in.tokens.rows; ++r) in.ids.push_back(int32_t(rng() % uint32_t(c.vocab_size)));
  for (int64_t r = 0; r < in.tokens.rows; ++r) in.targets.push_back(r % 5 == 3 ? -1 : int32_t(rng() % uint32_t(c.vocab_size)));
  return in;
}

double max_relative(const float* a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

// Variants of configs/nano.json covering every option of the model-level wiring.
const std::vector<std::pair<std::string, std::function<void(json&)>>> kVariants = {
    {"nano", {}},
    {"attn_res block 1", [](json& j) { j["attn_res"]["block_size"] = 1; }},
    {"attn_res block L", [](json& j) { j["attn_res"]["block_size"] = 4; }},
    {"pre-norm residual", [](json& j) { j["attn_res"]["enabled"] = false; }},
    {"tied, softplus, q_lora, latent MoE, situ",
     [](json& j) {
       j["tie_word_embeddings"] = true;
       j["kda"]["gate"] = "softplus";
       j["mla"]["q_lora_rank"] = 24;
       j["mla"]["qk_rope_head_dim"] = 0;
       j["moe"]["latent_dim"] = 48;
       j["moe"]["router_latent_dim"] = 16;
       j["moe"]["activation"] = "situ";
       j["moe"]["num_shared_experts"] = 2;
     }},
    {"Kimi K3: low-rank decay gate, unrotated q_pe/k_pe, SiTU everywhere, full-width shared experts after lat_up",
     [](json& j) {
       j["kda"]["gate_rank"] = 16;
       j["mla"]["rope"] = false;
       j["mla"]["q_lora_rank"] = 24;
       j["moe"]["latent_dim"] = 48;
       j["moe"]["activation"] = "situ";
       j["moe"]["dense_activation"] = "situ";
       j["moe"]["shared_activation"] = "situ";
       j["moe"]["situ_beta"] = 2.0;
       j["moe"]["situ_linear_beta"] = 3.0;
       j["moe"]["shared_full_width"] = true;
     }},
    {"Kimi Linear: softplus, low-rank decay and output gates, no MLA gate, unrotated, pre-norm",
     [](json& j) {
       j["kda"]["gate"] = "softplus";
       j["kda"]["gate_rank"] = 16;
       j["kda"]["output_gate_rank"] = 16;
       j["mla"]["rope"] = false;
       j["mla"]["output_gate"] = false;
       j["attn_res"]["enabled"] = false;
     }},
};

TEST(Model, LogitsMatchTheSpecReference) {
  for (const auto& [name, edit] : kVariants) {
    const ModelConfig config = test::nano_config(edit);
    Model model(config);
    test::randomize_params(model.params(), 3);
    const ModelInput in = random_input(config, {9, 14}, 5);
    const Tensor logits = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
    const auto ref = test::reference_logits(config, values_of(model), in.tokens, in.ids);
    EXPECT_LT(max_relative(logits.data<float>(), ref), 1e-4) << name;
  }
}

double reference_loss(const ModelConfig& c, const test::ParamValues& p, const ModelInput& in) {
  const auto logits = test::reference_logits(c, p, in.tokens, in.ids);
  double loss = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < in.tokens.rows; ++r) {
    const int32_t t = in.targets[size_t(r)];
    if (t < 0) continue;
    const double* row = logits.data() + r * c.vocab_size;
    double top = row[0], sum = 0;
    for (int64_t j = 0; j < c.vocab_size; ++j) top = std::max(top, row[j]);
    for (int64_t j = 0; j < c.vocab_size; ++j) sum += std::exp(row[j] - top);
    const double weight = in.loss_weights.empty() ? 1.0 : double(in.loss_weights[size_t(r)]);
    loss += weight * (top + std::log(sum) - row[t]);
    ++n;
  }
  return loss / double(n);
}

// Every parameter tensor: its largest-gradient entry and a random one, against central differences
// of the double-precision reference loss. The model computes in f32: its gradients carry ~1e-6
// relative rounding; 2e-3 of the tensor's largest gradient (+1e-7) leaves margin and still fails a
// dropped term or a wrong factor. MoE routing is discrete and the randomised weights make the loss
// steep: h = 1e-6 keeps every perturbation far from a routing flip (seen at ~1e-3 on an embedding
// entry), and the double evaluation keeps the difference exact to ~1e-9.
void expect_gradients_match_the_spec(const std::string& name, const ModelConfig& config, Model& model,
                                     const ModelInput& in) {
    model.params().zero_grads();
    const LossResult r = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::None, .backward = true}).loss;
    test::ParamValues p = values_of(model);
    EXPECT_NEAR(r.loss, reference_loss(config, p, in), 1e-4 * r.loss) << name;
    std::mt19937 rng(13);
    for (const auto& param : model.params().params()) {
      if (!param->trainable) continue;
      const float* g = param->g();
      int64_t top = 0;
      for (int64_t i = 1; i < param->numel(); ++i)
        if (std::fabs(g[i]) > std::fabs(g[top])) top = i;
      const double scale = std::fabs(g[top]);
      for (int64_t i : {top, int64_t(rng() % uint64_t(param->numel()))}) {
        const double h = 1e-6, saved = p[param->name][size_t(i)];
        p[param->name][size_t(i)] = saved + h;
        const double plus = reference_loss(config, p, in);
        p[param->name][size_t(i)] = saved - h;
        const double minus = reference_loss(config, p, in);
        p[param->name][size_t(i)] = saved;
        EXPECT_NEAR(g[i], (plus - minus) / (2 * h), 2e-3 * scale + 1e-7) << name << ": " << param->name << "[" << i << "]";
      }
    }
}

TEST(Model, GradientsMatchFiniteDifferencesOfTheSpec) {
  for (const auto& [name, edit] : kVariants) {
    const ModelConfig config = test::nano_config(edit);
    Model model(config);
    test::randomize_params(model.params(), 7);
    expect_gradients_match_the_spec(name, config, model, random_input(config, {7, 10}, 9));
  }
}

// Per-row loss weights (zero for prompts, negative advantages for policy gradients) scale each
// row's cross-entropy and its gradient; weights of 1 change no bit.
TEST(Model, LossWeightsScaleEachRowAndItsGradient) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  test::randomize_params(model.params(), 8);
  ModelInput in = random_input(config, {7, 10}, 10);
  const ForwardOptions options{.precision = Precision::F32, .outputs = Outputs::None};
  const double unweighted = model.forward(in, options).loss.loss;
  in.loss_weights.assign(in.targets.size(), 1.0f);
  EXPECT_EQ(model.forward(in, options).loss.loss, unweighted);
  std::mt19937 rng(3);
  for (float& w : in.loss_weights) w = float(int(rng() % 7) - 3) * 0.5f;  // -1.5 .. 1.5, zeros included
  expect_gradients_match_the_spec("weighted", config, model, in);
  in.loss_weights.pop_back();
  EXPECT_THROW(model.forward(in, options), Error);
}

// The expert-parallel seam: an exchange that runs each MoE layer's experts in two halves (as two
// processes holding half the experts each would) gives the same logits, loss and gradients, bit
// for bit, as running them all at once.
struct TwoHalves final : ExpertExchange {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  void run(const ExpertDispatch& dispatch, const Compute& compute) {
    const int64_t half = dispatch.experts / 2;
    for (auto [first, last] : {std::pair{int64_t(0), half}, std::pair{half, dispatch.experts}}) {
      compute(first, last);
      ranges.emplace_back(first, last);
    }
  }
  void forward(const ExpertDispatch& d, const float*, int64_t, float*, const Compute& compute, const Held&) override {
    run(d, compute);
  }
  void backward(const ExpertDispatch& d, const float*, int64_t, float*, float*, const Compute& compute,
                const Held&) override {
    run(d, compute);
  }
};

TEST(Model, ExpertsInTwoHalvesThroughTheExchangeMatchAllAtOnce) {
  const ModelConfig config = test::nano_config();
  Model whole(config), halves(config);
  test::randomize_params(whole.params(), 12);
  std::copy_n(whole.params().values(), whole.params().numel(), halves.params().values());
  halves.params().refresh_bf16();
  TwoHalves exchange;
  halves.set_expert_exchange(exchange);
  const ModelInput in = random_input(config, {11, 6}, 13);
  for (Model* m : {&whole, &halves}) m->params().zero_grads();
  const ForwardOptions train{.precision = Precision::F32, .outputs = Outputs::All, .backward = true};
  const ForwardResult a = whole.forward(in, train), b = halves.forward(in, train);
  EXPECT_EQ(a.loss.loss, b.loss.loss);
  EXPECT_EQ(std::memcmp(a.logits.data<float>(), b.logits.data<float>(), a.logits.nbytes()), 0);
  EXPECT_EQ(std::memcmp(whole.params().grads(), halves.params().grads(), size_t(whole.params().numel()) * 4), 0);
  const int64_t moe_layers = config.num_hidden_layers - config.moe.first_k_dense_replace;
  ASSERT_EQ(int64_t(exchange.ranges.size()), 2 * 2 * moe_layers);  // forward and backward, two halves each
  const int64_t half = config.moe.num_experts / 2;
  EXPECT_EQ(exchange.ranges[0], (std::pair<int64_t, int64_t>{0, half}));
  EXPECT_EQ(exchange.ranges[1], (std::pair<int64_t, int64_t>{half, config.moe.num_experts}));
}

// Parameter ownership: a process that holds half the routed experts allocates, initialises and
// loads only those (and every non-expert parameter); the other half's slot rows are computed by
// the process holding them — here a second model in this process, reached through the exchange
// as a network exchange would reach another rank. The logits are those of the whole model, bit
// for bit.
struct PartnerHoldsTheRest final : ExpertExchange {
  Model* partner = nullptr;
  int64_t first_remote = 0;
  size_t call = 0;
  Workspace workspace;
  void forward(const ExpertDispatch& d, const float* x, int64_t, float* slot_rows, const Compute& compute,
               const Held&) override {
    compute(0, first_remote);
    const std::vector<MoeFfn*> layers = partner->moe_layers();
    layers[call++ % layers.size()]->routed_experts().forward(x, d, first_remote, d.experts, Precision::F32, {},
                                                              slot_rows, workspace);
  }
  void backward(const ExpertDispatch&, const float*, int64_t, float*, float*, const Compute&, const Held&) override {
    ADD_FAILURE() << "inference only";
  }
};

TEST(Model, AProcessHoldsOnlyItsExperts) {
  const ModelConfig config = test::nano_config();
  const int64_t E = config.moe.num_experts, half = E / 2;
  Model whole(config), low(config, /*allocate=*/false), high(config, /*allocate=*/false);
  whole.initialize(5);
  low.params().hold_only(holds_experts(0, half));
  high.params().hold_only(holds_experts(half, E));
  int64_t high_expert_numel = 0;
  for (const auto& p : whole.params().params()) high_expert_numel += routed_expert_of(p->name) >= half ? p->numel() : 0;
  ASSERT_GT(high_expert_numel, 0);
  for (Model* m : {&low, &high}) {
    m->params().allocate();
    m->initialize(5);
  }
  EXPECT_EQ(low.params().numel(), whole.params().numel() - high_expert_numel);
  for (const auto& p : whole.params().params()) {
    const Param& mine = low.params().get(p->name);
    ASSERT_EQ(mine.held, routed_expert_of(p->name) < half) << p->name;
    if (mine.held) EXPECT_EQ(std::memcmp(mine.value.raw(), p->value.raw(), p->value.nbytes()), 0) << p->name;
    else EXPECT_FALSE(mine.value.defined()) << p->name;
  }
  // Loading a whole model file holds only the process's share, and saving writes only that share.
  test::TempDir dir;
  whole.save(dir.path() / "model", DType::F32);
  const auto loaded = Model::load(dir.path() / "model", {.holds = holds_experts(half, E)});
  EXPECT_EQ(loaded->params().numel(), whole.params().numel() - (whole.params().numel() - high.params().numel()));
  for (const auto& p : high.params().params()) {
    if (p->held) {
      EXPECT_EQ(std::memcmp(loaded->params().get(p->name).value.raw(), p->value.raw(), p->value.nbytes()), 0);
    }
  }
  EXPECT_EQ(int64_t(high.params().named_values(DType::F32).size()),
            int64_t(whole.params().params().size()) - int64_t(std::count_if(
                whole.params().params().begin(), whole.params().params().end(),
                [&](const auto& p) { const int64_t e = routed_expert_of(p->name); return e >= 0 && e < half; })));

  PartnerHoldsTheRest exchange;
  exchange.partner = &high;
  exchange.first_remote = half;
  low.set_expert_exchange(exchange);
  const ModelInput in = random_input(config, {9, 5}, 3);
  const ForwardOptions options{.precision = Precision::F32, .outputs = Outputs::All};
  const ForwardResult a = whole.forward(in, options), b = low.forward(in, options);
  ASSERT_EQ(a.logits.nbytes(), b.logits.nbytes());
  EXPECT_EQ(std::memcmp(a.logits.data<float>(), b.logits.data<float>(), a.logits.nbytes()), 0);
  EXPECT_EQ(exchange.call, whole.moe_layers().size());
}

// A model with images in its prompt against SPEC's double reference (tests/spec_reference.h): the
// logits, then the gradients of the mean next-token loss over 4 random entries of each of `names`.
void expect_image_model_matches_the_spec(const ModelConfig& config, Model& model, const ModelInput& in,
                                         const std::vector<const char*>& names, std::mt19937& rng) {
  const int32_t pad = in.image_pad_id;
  const Tensor logits = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
  test::ParamValues p = values_of(model);
  EXPECT_LT(max_relative(logits.data<float>(), test::reference_logits(config, p, in.tokens, in.ids, in.images, pad)),
            1e-4);
  model.params().zero_grads();
  model.forward(in, {.precision = Precision::F32, .outputs = Outputs::None, .backward = true});
  auto loss = [&] {
    const auto l = test::reference_logits(config, p, in.tokens, in.ids, in.images, pad);
    double total = 0;
    int n = 0;
    for (size_t r = 0; r < in.ids.size(); ++r) {
      if (in.targets[r] < 0) continue;
      const double* row = l.data() + r * 256;
      double top = row[0], sum = 0;
      for (int j = 0; j < 256; ++j) top = std::max(top, row[j]);
      for (int j = 0; j < 256; ++j) sum += std::exp(row[j] - top);
      total += top + std::log(sum) - row[in.targets[r]];
      ++n;
    }
    return total / n;
  };
  for (const char* name : names) {
    const Param& param = model.params().get(name);
    double scale = 0;
    for (int64_t i = 0; i < param.numel(); ++i) scale = std::max(scale, double(std::fabs(param.grad.data<float>()[i])));
    EXPECT_GT(scale, 0.0) << name;
    for (int trial = 0; trial < 4; ++trial) {
      const size_t i = rng() % size_t(param.numel());
      const double h = 1e-6, saved = p[name][i];
      p[name][i] = saved + h;
      const double plus = loss();
      p[name][i] = saved - h;
      const double minus = loss();
      p[name][i] = saved;
      EXPECT_NEAR(param.grad.data<float>()[i], (plus - minus) / (2 * h), 2e-3 * scale + 1e-7) << name << "[" << i << "]";
    }
  }
}

// The prompt both image tests use: 6 image positions among 12 rows, each row's next token its target
// (none at the pads).
ModelInput image_prompt(const Image& img, int32_t pad) {
  ModelInput in;
  in.ids = {5, 248, pad, pad, pad, pad, pad, pad, 249, 17, 33, 8};
  in.tokens = TokenBatch::packed({12});
  in.images = {img};
  in.image_pad_id = pad;
  for (size_t r = 0; r < in.ids.size(); ++r)
    in.targets.push_back(r + 1 < in.ids.size() && in.ids[r + 1] != pad ? in.ids[r + 1] : -1);
  in.targets.back() = 3;
  return in;
}

// SPEC §7: an image's patches replace the <|image_pad|> rows; no loss is computed at them.
TEST(Model, ImagePatchesMatchTheSpecAndTheirGradients) {
  const ModelConfig config = test::nano_config([](json& j) { j["vision"]["enabled"] = true; j["vision"]["channels"] = 2; });
  Model model(config);
  test::randomize_params(model.params(), 21);
  const int32_t pad = 250;
  Image img{14, 21, 2, {}};  // 2 × 3 patches of 7×7×2
  std::mt19937 rng(4);
  for (int i = 0; i < 14 * 21 * 2; ++i) img.pixels.push_back(uint8_t(rng() % 256));
  ModelInput in = image_prompt(img, pad);
  expect_image_model_matches_the_spec(config, model, in,
                                      {"model.vision.patch_proj.weight", "model.vision.patch_proj.bias",
                                       "model.vision.row_embed", "model.vision.col_embed"},
                                      rng);
  // Wrong inputs are errors, not crashes.
  in.ids[3] = 7;  // one pad short of the image's 6 patches
  EXPECT_THROW(model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits, Error);
  in.ids[3] = pad;
  in.images[0].width = 20;  // not a multiple of the patch size
  EXPECT_THROW(model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits, Error);
}

// SPEC §7.2: MoonViT's merged tokens replace the <|image_pad|> rows, in both published variants;
// its parameters' gradients come through the language model.
TEST(Model, MoonVitImagesMatchTheSpecAndTheirGradients) {
  for (const bool k3 : {false, true}) {
    SCOPED_TRACE(k3 ? "K3's variant" : "K2.5's variant");
    const ModelConfig config = test::nano_config([k3](json& j) {
      j["vision"] = {{"enabled", true}, {"tower", "moonvit"}, {"patch_size", 2}, {"channels", 3},
                     {"moonvit",
                      {{"hidden_size", 16}, {"num_heads", 2}, {"head_dim", 8}, {"num_layers", 1},
                       {"intermediate_size", 24}, {"pos_emb_height", 3}, {"pos_emb_width", 3}}}};
      if (k3)
        j["vision"]["moonvit"].update({{"norm", "rmsnorm"}, {"norm_eps", 0.0078125}, {"bias", false},
                                       {"pos_emb_resample", "bilinear"}, {"projector", "patchmergerv2"}});
    });
    EXPECT_EQ(ModelConfig::from_json(config.to_json()).to_json(), config.to_json());
    Model model(config);
    EXPECT_EQ(model.params().numel(), count_parameters(config).total_sum());
    test::randomize_params(model.params(), 23);
    const int32_t pad = 250;
    Image img{8, 12, 3, {}};  // 4 × 6 patches of 2×2: 2 × 3 merged tokens
    std::mt19937 rng(5);
    for (int i = 0; i < 8 * 12 * 3; ++i) img.pixels.push_back(uint8_t(rng() % 256));
    ModelInput in = image_prompt(img, pad);
    expect_image_model_matches_the_spec(
        config, model, in,
        {"vision_tower.patch_embed.proj.weight", "vision_tower.patch_embed.pos_emb.weight",
         "vision_tower.encoder.blocks.0.wqkv.weight", "vision_tower.encoder.blocks.0.norm1.weight",
         "mm_projector.proj.0.weight", "mm_projector.proj.2.weight"},
        rng);
    // Wrong inputs are errors, not crashes.
    in.ids[3] = 7;  // one pad short of the image's 6 tokens
    EXPECT_THROW(model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits, Error);
    in.ids[3] = pad;
    in.images[0].width = 10;  // not whole merge windows
    in.images[0].pixels.resize(8 * 10 * 3);
    EXPECT_THROW(model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits, Error);
  }
}

TEST(Model, SaveLoadRoundTrips) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  model.initialize(11);
  const ModelInput in = random_input(config, {12}, 1);
  const Tensor before = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
  test::TempDir dir;
  model.save(dir / "f32");
  const auto loaded = Model::load(dir / "f32");
  const Tensor after = loaded->forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
  EXPECT_EQ(std::memcmp(before.raw(), after.raw(), before.nbytes()), 0);

  // bf16 and f16 files: loading gives exactly the rounded weights, hence the rounded model's logits.
  for (DType dtype : {DType::BF16, DType::F16}) {
    model.save(dir / "half", dtype);
    const auto half = Model::load(dir / "half");
    Model rounded(config);
    for (const auto& p : model.params().params()) {
      const Tensor r = p->value.to(dtype).to(DType::F32);
      std::memcpy(rounded.params().get(p->name).v(), r.raw(), r.nbytes());
    }
    rounded.params().refresh_bf16();
    const Tensor a = half->forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits, b = rounded.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << dtype_name(dtype);
  }
}

TEST(Model, LogitsCommandAgreesWithTheSpecReference) {
  test::TempDir dir;
  const std::string model_dir = (dir / "m").string(), out = (dir / "logits.safetensors").string();
  ASSERT_EQ(test::run_hyla("init --config " + (test::source_dir() / "configs/nano.json").string() + " --out " + model_dir +
                           " --seed 5").exit_code, 0);
  const auto r = test::run_hyla("logits --model " + model_dir + " --tokens '[3, 1, 4, 1, 5, 9, 2, 6]' --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile file(out);
  const Tensor logits = file.get("logits");
  ASSERT_EQ(logits.shape(), (Shape{8, 256}));
  const auto model = Model::load(model_dir);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  const auto ref = test::reference_logits(model->config(), values_of(*model), TokenBatch::uniform(1, 8), ids);
  EXPECT_LT(max_relative(logits.data<float>(), ref), 1e-4);
  EXPECT_NE(test::run_hyla("logits --model " + model_dir + " --tokens '[1, 999]' --out " + out).exit_code, 0);
  EXPECT_NE(test::run_hyla("logits --model " + model_dir + " --tokens 'x' --out " + out).exit_code, 0);
}

// bf16 matmul inputs: every projection rounds its inputs to bf16 (≤ 2^-9 relative each); the nano
// model chains ~20 products (4 layers × projections, attention, experts, head), so errors of a few
// 2^-9 ≈ 2e-3 each accumulate to ~1e-2 of the logits' scale (measured 5e-3 with SPEC's init).
// Bound 3e-2.
TEST(Model, Bf16MatmulsStayCloseToF32) {
  const ModelConfig config = test::nano_config();
  Model model(config);
  model.initialize(2);
  const ModelInput in = random_input(config, {20, 5}, 4);
  const Tensor a = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits, b = model.forward(in, {.precision = Precision::BF16, .outputs = Outputs::All}).logits;
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
    scale = std::max(scale, double(std::fabs(a.data<float>()[i])));
  }
  EXPECT_LT(diff / scale, 3e-2);
  EXPECT_GT(diff, 0.0);
}

}  // namespace
}  // namespace hyla
