// Feed-forward layers (SPEC §5): the dense FFN and the MoE FFN against a double-precision
// reference written here straight from the SPEC (loops, no shared code with the layers), backward
// against central differences of that reference, k = E against the dense mixture of all experts,
// balancing rules, load statistics, and the bf16 forward against f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hyla/io/json_fields.h"
#include "hyla/kernels/matmul.h"
#include "hyla/model/ffn.h"
#include "spec_reference.h"
#include "test_util.h"

namespace hyla {
namespace {

using json = nlohmann::json;
using Params = test::ParamValues;
using test::MoeReference;

// The reference over parameters held by value (the call's temporaries live until it returns).
MoeReference reference_moe_of(const ModelConfig& c, const Params& P, const std::vector<double>& u, int64_t n) {
  return test::reference_moe(c, test::SpecWeights{&P, ""}, u, n);
}

// configs/nano.json with a tiny FFN: d = 16, 8 experts of width 8, top-2. initializer_range 0.5
// puts the gates in their non-linear range, so the checks exercise every curvature.
ModelConfig tiny_config(const std::function<void(json&)>& edit = {}) {
  json j = parse_json_file((test::source_dir() / "configs" / "nano.json").string());
  j["hidden_size"] = 16;
  j["initializer_range"] = 0.5;
  json& m = j["moe"];
  m["num_experts"] = 8;
  m["num_experts_per_tok"] = 2;
  m["moe_intermediate_size"] = 8;
  m["intermediate_size"] = 24;
  m["num_shared_experts"] = 1;
  m["balancing"] = "none";
  if (edit) edit(j);
  return ModelConfig::from_json(j, "test config");
}

// One FFN layer registered alone in its own store, under the prefix "mlp.".
template <typename Layer>
struct Layered {
  ModelConfig config;
  ParamStore store;
  std::unique_ptr<Layer> layer;
  explicit Layered(const ModelConfig& c, uint64_t seed = 7) : config(c) {
    layer = std::make_unique<Layer>(store, "mlp.", config);
    store.allocate();
    store.initialize(config, seed);
    store.refresh_bf16();
  }
  float* value(const std::string& name) { return store.get("mlp." + name).v(); }
  int64_t d() const { return config.hidden_size; }
};

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Params params_of(const ParamStore& store) {
  Params p;
  for (const auto& param : store.params()) {
    const float* v = param->value.data<float>();
    p[param->name].assign(v, v + param->numel());
  }
  return p;
}

template <typename Layer>
std::vector<float> forward(Layer& layer, const std::vector<float>& u, int64_t n, int64_t d,
                           Precision precision = Precision::F32, bool save = true, float loss_scale = 1.0f) {
  const TokenBatch tokens = TokenBatch::uniform(1, n);
  const ForwardContext ctx{tokens, test::test_workspace(), precision, save, loss_scale};
  std::vector<float> y(static_cast<size_t>(n * d));
  layer.forward(u.data(), y.data(), ctx);
  return y;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_LE(worst, tol * std::max(scale, 1e-3)) << what << ": worst error " << worst << " at output scale " << scale;
}

// ---- gradient checks ----

std::vector<int64_t> sample_entries(int64_t n, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(std::min<int64_t>(count, n)));
  return all;
}

std::vector<int64_t> all_entries(int64_t n) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

// Forward and backward of the layer vs the reference: output, dL/du for every entry and a sample
// of every trainable parameter, for L = loss_scale · (Σ R ⊙ y + aux); R = 0 when `aux_only`
// isolates the aux_loss term's gradient.
template <typename Layer, typename RefFn>
void check_layer(Layered<Layer>& s, RefFn reference, int64_t n, float loss_scale, const std::string& what,
                 bool aux_only = false) {
  const int64_t d = s.d();
  const std::vector<float> u = test::normal_floats(n * d, 11);
  const std::vector<float> R = test::normal_floats(n * d, 12, aux_only ? 0.0f : 1.0f);
  std::vector<float> dy(R);
  for (float& v : dy) v *= loss_scale;

  Params P = params_of(s.store);
  std::vector<double> ud = to_double(u);
  const std::vector<float> y = forward(*s.layer, u, n, d, Precision::F32, true, loss_scale);
  double aux = 0.0;
  {
    const auto ref = reference(P, ud);
    expect_close(y, ref.first, 1e-5, what + " forward");
    aux = ref.second;
  }
  if constexpr (std::is_same_v<Layer, MoeFfn>) {
    EXPECT_NEAR(s.layer->aux_loss(), aux, 1e-6 + 1e-5 * std::abs(aux)) << what;
  }

  s.store.zero_grads();
  std::vector<float> du(static_cast<size_t>(n * d), -1.0f);  // overwritten, not accumulated
  s.layer->backward(dy.data(), du.data());

  auto loss = [&]() {
    const auto ref = reference(P, ud);
    double l = ref.second;
    for (size_t i = 0; i < R.size(); ++i) l += R[i] * ref.first[i];
    return double(loss_scale) * l;
  };
  test::expect_gradients(what + " du", loss, ud, [&](int64_t i) { return double(du[size_t(i)]); }, all_entries(n * d));
  int checked = 0;
  for (const auto& param : s.store.params()) {
    if (!param->trainable) {
      EXPECT_FALSE(param->grad.defined()) << param->name << " is a buffer without gradient";
      continue;
    }
    const bool expert = param->name.find(".experts.") != std::string::npos;
    const float* g = param->g();
    test::expect_gradients(what + " " + param->name, loss, P[param->name], [&](int64_t i) { return double(g[i]); },
                     sample_entries(param->numel(), expert ? 4 : 12, uint32_t(checked)));
    ++checked;
  }
}

void check_moe(const ModelConfig& config, int64_t n, float loss_scale, const std::string& what,
               bool aux_only = false) {
  Layered<MoeFfn> s(config);
  const std::vector<float> bias = test::normal_floats(config.moe.num_experts, 5, 0.1f);
  std::copy(bias.begin(), bias.end(), s.value("gate.e_score_correction_bias"));
  // The check is only meaningful away from routing ties (a tie flips under the differences).
  const MoeReference unperturbed =
      reference_moe_of(s.config, params_of(s.store), to_double(test::normal_floats(n * s.d(), 11)), n);
  ASSERT_GT(unperturbed.min_gap, 1e-3) << what;
  check_layer(
      s,
      [&](const Params& P, const std::vector<double>& u) {
        MoeReference r = test::reference_moe(s.config, test::SpecWeights{&P, ""}, u, n);
        return std::make_pair(r.y, r.aux);
      },
      n, loss_scale, what, aux_only);
}

TEST(Ffn, DenseMatchesReferenceAndDifferences) {
  Layered<DenseFfn> s(tiny_config());
  check_layer(
      s,
      [&](const Params& P, const std::vector<double>& u) {
        return std::make_pair(test::reference_dense(s.config, test::SpecWeights{&P, ""}, u, 20), 0.0);
      },
      20, 1.0f, "dense");
}

TEST(Moe, PlainRouterSwigluOneShared) { check_moe(tiny_config(), 24, 1.0f, "plain/swiglu/1 shared"); }

TEST(Moe, LatentRouterSituNoShared) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["router_latent_dim"] = 4;
              j["moe"]["activation"] = "situ";
              j["moe"]["num_shared_experts"] = 0;
            }),
            24, 1.0f, "latent router/situ/0 shared");
}

TEST(Moe, LatentExpertsTwoShared) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["latent_dim"] = 8;
              j["moe"]["num_shared_experts"] = 2;
            }),
            24, 1.0f, "latent dim 8/swiglu/2 shared");
}

TEST(Moe, LatentEverythingSituAuxLoss) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["router_latent_dim"] = 4;
              j["moe"]["latent_dim"] = 8;
              j["moe"]["activation"] = "situ";
              j["moe"]["balancing"] = "aux_loss";
              j["moe"]["aux_loss_coef"] = 0.5;
            }),
            24, 0.5f, "latent router + latent dim/situ/aux_loss");
}

// Kimi K3's FFN (SPEC §5): SiTU everywhere at β, λ of the config, shared experts on u at full
// width added after lat_up; and the dense layer on SiTU.
TEST(Moe, K3SharedExpertsAfterTheLatentUpProjection) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["latent_dim"] = 8;
              j["moe"]["num_shared_experts"] = 2;
              j["moe"]["shared_full_width"] = true;
              j["moe"]["activation"] = "situ";
              j["moe"]["shared_activation"] = "situ";
              j["moe"]["situ_beta"] = 2.0;
              j["moe"]["situ_linear_beta"] = 3.0;
            }),
            24, 1.0f, "latent dim 8/situ/2 full-width shared after lat_up");
}

// A latent MoE without lat_norm (moe.latent_norm false: a K3 GGUF without ffn_routed_norm, as
// llama.cpp's graph then runs it): lat_up reads m as it is.
TEST(Moe, LatentWithoutItsNorm) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["latent_dim"] = 8;
              j["moe"]["num_shared_experts"] = 2;
              j["moe"]["shared_full_width"] = true;
              j["moe"]["latent_norm"] = false;
            }),
            24, 1.0f, "latent dim 8/no lat_norm/full-width shared");
}

TEST(Moe, SituWithAnUnboundedUpBranch) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["activation"] = "situ";
              j["moe"]["shared_activation"] = "situ";
              j["moe"]["situ_beta"] = 1.5;
              j["moe"]["situ_linear_beta"] = 0.0;
            }),
            24, 1.0f, "situ beta 1.5, linear_beta 0 (up unbounded)");
}

// Ling 3.0's FFN: SwiGLU clamped in the routed and the shared experts (each its own limit, small
// enough that both bounds bind on some rows), two shared experts as one MLP of its own width.
TEST(Moe, ClampedSwigluAndSharedExpertsOfTheirOwnWidth) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["num_shared_experts"] = 2;
              j["moe"]["shared_intermediate_size"] = 12;
              j["moe"]["swiglu_limit"] = 0.3;
              j["moe"]["shared_swiglu_limit"] = 0.2;
            }),
            24, 1.0f, "clamped swiglu/shared width 12");
}

TEST(Ffn, DenseSituMatchesReferenceAndDifferences) {
  Layered<DenseFfn> s(tiny_config([](json& j) {
    j["moe"]["dense_activation"] = "situ";
    j["moe"]["situ_beta"] = 2.5;
    j["moe"]["situ_linear_beta"] = 4.0;
  }));
  check_layer(
      s,
      [&](const Params& P, const std::vector<double>& u) {
        return std::make_pair(test::reference_dense(s.config, test::SpecWeights{&P, ""}, u, 20), 0.0);
      },
      20, 1.0f, "dense situ");
}

// The aux_loss term alone (no output gradient): its gradient through P into the router and u.
TEST(Moe, AuxLossGradientAlone) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["balancing"] = "aux_loss";
              j["moe"]["aux_loss_coef"] = 1.0;
            }),
            24, 0.5f, "aux_loss alone", /*aux_only=*/true);
}

TEST(Moe, PlainRouterAuxLossTwoShared) {
  check_moe(tiny_config([](json& j) {
              j["moe"]["balancing"] = "aux_loss";
              j["moe"]["aux_loss_coef"] = 0.3;
              j["moe"]["num_shared_experts"] = 2;
              j["moe"]["num_experts_per_tok"] = 3;
            }),
            24, 1.0f, "plain/aux_loss/k=3/2 shared");
}

// More slots per expert than one block of the expert kernel, so that an expert's slots split into
// blocks and its gradients accumulate over them: the output matches the reference, and the
// gradients equal those of the two halves of the batch run separately (one block each; tokens are
// independent without the aux_loss term).
TEST(Moe, ExpertsSpanningSeveralBlocks) {
  const ModelConfig config = tiny_config([](json& j) { j["moe"]["num_experts"] = 4; });
  const int64_t n = 640, half = n / 2;  // ~320 slots per expert > RoutedExperts::kTokenBlock ≥ 160
  Layered<MoeFfn> s(config);
  const int64_t d = s.d();
  const std::vector<float> u = test::normal_floats(n * d, 3), dy = test::normal_floats(n * d, 4);
  s.store.zero_grads();
  const std::vector<float> y = forward(*s.layer, u, n, d);
  expect_close(y, reference_moe_of(s.config, params_of(s.store), to_double(u), n).y, 1e-5, "blocks forward");
  const ExpertLoadStats stats = s.layer->load_stats();
  EXPECT_GT(*std::max_element(stats.tokens_per_expert.begin(), stats.tokens_per_expert.end()),
            RoutedExperts::kTokenBlock);
  std::vector<float> du(static_cast<size_t>(n * d)), du_halves(du.size());
  s.layer->backward(dy.data(), du.data());
  const std::vector<float> grads(s.store.grads(), s.store.grads() + s.store.numel());
  s.store.zero_grads();
  for (int64_t h = 0; h < 2; ++h) {
    const std::vector<float> part(u.begin() + h * half * d, u.begin() + (h + 1) * half * d);
    forward(*s.layer, part, half, d);
    s.layer->backward(dy.data() + h * half * d, du_halves.data() + h * half * d);
  }
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) {
    worst = std::max(worst, double(std::abs(grads[i] - s.store.grads()[i])));
    scale = std::max(scale, double(std::abs(grads[i])));
  }
  EXPECT_LE(worst, 1e-5 * scale);
  for (size_t i = 0; i < du.size(); ++i) ASSERT_NEAR(du[i], du_halves[i], 1e-5f) << i;
}

// With k = E every expert is selected: the layer is the dense mixture Σ_e (s_e / Σ s) · S · E_e + shared.
TEST(Moe, AllExpertsSelectedIsTheDenseMixture) {
  const ModelConfig config = tiny_config([](json& j) {
    j["moe"]["num_experts"] = 4;
    j["moe"]["num_experts_per_tok"] = 4;
  });
  Layered<MoeFfn> s(config);
  const int64_t n = 16, d = s.d(), E = 4, w = config.moe.moe_intermediate_size;
  const std::vector<float> u = test::normal_floats(n * d, 21);
  const std::vector<float> y = forward(*s.layer, u, n, d);
  const Params P = params_of(s.store);
  std::vector<double> want(static_cast<size_t>(n * d), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> ut(u.begin() + t * d, u.begin() + (t + 1) * d), s_t(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) s_t[e] = test::sigmoid_ref(test::row_dot(P.at("mlp.gate.weight"), e, d, ut.data()));
    const double total = std::accumulate(s_t.begin(), s_t.end(), 0.0);
    for (int64_t e = 0; e < E; ++e)
      test::add_mlp({&P, ""}, "mlp.experts." + std::to_string(e) + ".", d, w, 0, w, config.moe, Activation::Swiglu, 0.0,
              ut.data(), s_t[e] / total * config.moe.routed_scaling_factor, want.data() + t * d);
    test::add_mlp({&P, ""}, "mlp.shared_experts.", d, w, 0, w, config.moe, Activation::Swiglu, 0.0, ut.data(), 1.0, want.data() + t * d);
  }
  expect_close(y, want, 1e-5, "k = E");
}

// All scores equal (zero router weights, zero bias): every token takes the k lowest expert ids,
// with equal weights.
TEST(Moe, TiesGoToTheLowerExpertId) {
  Layered<MoeFfn> s(tiny_config());
  std::fill_n(s.value("gate.weight"), 8 * s.d(), 0.0f);
  Workspace workspace;
  Arena kept;
  LayerActivations activations(kept, workspace, /*keep=*/false);
  const Routing routing = s.layer->router().route(test::normal_floats(5 * s.d(), 1).data(), 5, activations);
  for (int64_t t = 0; t < 5; ++t) {
    EXPECT_EQ(routing.expert_ids()[t * 2], 0);
    EXPECT_EQ(routing.expert_ids()[t * 2 + 1], 1);
    EXPECT_FLOAT_EQ(routing.w()[t * 2], 1.25f);  // routed_scaling_factor / k
  }
}

TEST(Moe, LoadStatsOfAHandMadeRouting) {
  // Three tokens, four experts, top-2: choices {0,1}, {0,2}, {0,1} → loads 3, 2, 1, 0.
  MoeConfig config;
  config.num_experts = 4;
  config.num_experts_per_tok = 2;
  config.balancing = Balancing::None;
  std::vector<float> scores(12, 0.0f);
  std::vector<int32_t> ids = {0, 1, 0, 2, 0, 1};
  const Routing routing{3, 4, 2, scores.data(), ids.data()};
  LoadBalancer balancer(config);
  const float bias[4] = {0, 0, 0, 0};
  balancer.record(routing, bias, true);
  ExpertLoadStats stats = balancer.stats();
  EXPECT_EQ(stats.tokens_per_expert, (std::vector<int64_t>{3, 2, 1, 0}));
  EXPECT_FLOAT_EQ(stats.max_over_mean, 2.0f);  // 3 / (6 / 4)
  EXPECT_EQ(stats.dead_experts, 1);
  balancer.record(routing, bias, true);  // a second micro-batch of the step adds up
  EXPECT_EQ(balancer.stats().tokens_per_expert, (std::vector<int64_t>{6, 4, 2, 0}));
  float moved[4] = {0, 0, 0, 0};
  std::vector<int64_t> counts(size_t(balancer.counts_size(false)));
  balancer.export_counts(moved, false, counts.data());
  EXPECT_EQ(counts, (std::vector<int64_t>{6, 4, 2, 0, 6}));  // loads, then tokens
  balancer.update(moved, counts.data(), false);  // rule none: the bias stays, the step's counts reset
  EXPECT_EQ(moved[0], 0.0f);
  EXPECT_EQ(balancer.stats().tokens_per_expert, (std::vector<int64_t>{3, 2, 1, 0}));  // the last forward
}

// Through the layer: a bias of +10 on experts 2 and 5 sends every token to exactly those two.
TEST(Moe, LoadStatsThroughTheLayer) {
  Layered<MoeFfn> s(tiny_config());
  s.value("gate.e_score_correction_bias")[2] = 10.0f;
  s.value("gate.e_score_correction_bias")[5] = 10.0f;
  const int64_t n = 10;
  forward(*s.layer, test::normal_floats(n * s.d(), 2), n, s.d());
  forward(*s.layer, test::normal_floats(n * s.d(), 3), n, s.d());
  const ExpertLoadStats stats = s.layer->load_stats();
  EXPECT_EQ(stats.tokens_per_expert, (std::vector<int64_t>{0, 0, 2 * n, 0, 0, 2 * n, 0, 0}));
  EXPECT_FLOAT_EQ(stats.max_over_mean, 4.0f);  // 2n / (2 · 2n / 8)
  EXPECT_EQ(stats.dead_experts, 6);
}

// A router skewed towards experts 0 and 1 (inputs share a direction those two rows align with):
// without balancing they take nearly every token; the quantile rule fixes that within 20 steps.
std::vector<float> skewed_balancing_run(const std::string& rule, double speed, int steps,
                                        std::vector<float>* bias_after_first = nullptr) {
  const ModelConfig config = tiny_config([&](json& j) {
    j["initializer_range"] = 0.2;
    j["moe"]["num_experts"] = 16;
    j["moe"]["balancing"] = rule;
    j["moe"]["bias_update_speed"] = speed;
    j["moe"]["num_shared_experts"] = 0;
  });
  Layered<MoeFfn> s(config);
  const int64_t n = 2048, d = s.d();
  for (int e = 0; e < 2; ++e) s.value("gate.weight")[e * d] = 2.0f;
  std::vector<float> max_over_mean;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> u = test::normal_floats(n * d, 100 + step);
    for (int64_t t = 0; t < n; ++t) u[t * d] += 3.0f;
    forward(*s.layer, u, n, d);
    max_over_mean.push_back(s.layer->load_stats().max_over_mean);
    MoeFfn* layer = s.layer.get();
    update_balancing(std::span(&layer, 1), single_process());
    if (step == 0 && bias_after_first) {
      const float* b = s.value("gate.e_score_correction_bias");
      bias_after_first->assign(b, b + 16);
    }
  }
  return max_over_mean;
}

TEST(Moe, QuantileBalancingEvensASkewedRouter) {
  const std::vector<float> none = skewed_balancing_run("none", 0.0, 20);
  for (float r : none) EXPECT_GT(r, 3.0f);
  const std::vector<float> quantile = skewed_balancing_run("quantile", 0.0, 20);
  EXPECT_GT(quantile.front(), 3.0f);
  EXPECT_LT(quantile.back(), 1.5f) << "after 20 steps";
  const int first_below = int(std::find_if(quantile.begin(), quantile.end(), [](float r) { return r < 1.5f; }) -
                              quantile.begin());
  std::printf("quantile: max/mean %.2f at step 0, %.2f at step 1, < 1.5 from step %d, %.2f at step 19\n",
              quantile[0], quantile[1], first_below, quantile.back());
}

TEST(Moe, BiasSignMovesLoadTheRightWay) {
  std::vector<float> bias;
  const std::vector<float> r = skewed_balancing_run("bias_sign", 0.02, 30, &bias);
  // After the first step: overloaded experts 0, 1 down by γ, every starved one up by γ.
  EXPECT_FLOAT_EQ(bias[0], -0.02f);
  EXPECT_FLOAT_EQ(bias[1], -0.02f);
  for (int e = 2; e < 16; ++e) EXPECT_FLOAT_EQ(bias[e], 0.02f) << e;
  EXPECT_LT(r.back(), 0.6f * r.front());
}

// bf16 products: each input rounded to 8 significant bits (relative error ≤ 2^-9). For inputs of
// random sign the rounding errors of a K-term product add like a random walk, as the terms do,
// so each product's error is ~2^-9 of its output scale; the layer chains two or three products
// (latent: lat_down, expert, lat_up), ~0.5% in all. 2% of the output norm bounds that with margin
// while catching any error of the products' shapes or operands. Routing is identical: the router
// stays f32.
TEST(Moe, Bf16ForwardCloseToF32) {
  for (int64_t latent : {0, 32}) {
    const ModelConfig config = tiny_config([&](json& j) {
      j["hidden_size"] = 64;
      j["initializer_range"] = 0.1;
      j["moe"]["moe_intermediate_size"] = 32;
      j["moe"]["latent_dim"] = latent;
    });
    Layered<MoeFfn> s(config);
    const int64_t n = 96;
    const std::vector<float> u = test::normal_floats(n * 64, 4);
    const std::vector<float> y32 = forward(*s.layer, u, n, 64, Precision::F32, false);
    const std::vector<float> y16 = forward(*s.layer, u, n, 64, Precision::BF16, false);
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < y32.size(); ++i) err += std::pow(y16[i] - y32[i], 2), norm += std::pow(y32[i], 2);
    EXPECT_LT(std::sqrt(err / norm), 0.02) << "latent " << latent;
    EXPECT_GT(std::sqrt(err / norm), 1e-5) << "bf16 products in use";
  }
  Layered<DenseFfn> dense(tiny_config([](json& j) { j["hidden_size"] = 64; }));
  const std::vector<float> u = test::normal_floats(96 * 64, 4);
  const std::vector<float> y32 = forward(*dense.layer, u, 96, 64, Precision::F32, false);
  const std::vector<float> y16 = forward(*dense.layer, u, 96, 64, Precision::BF16, false);
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < y32.size(); ++i) err += std::pow(y16[i] - y32[i], 2), norm += std::pow(y32[i], 2);
  EXPECT_LT(std::sqrt(err / norm), 0.02) << "dense";
}

// bf16 backward runs the same products with rounded inputs: close to the f32 gradients.
TEST(Moe, Bf16BackwardCloseToF32) {
  const ModelConfig config = tiny_config([](json& j) {
    j["hidden_size"] = 64;
    j["initializer_range"] = 0.1;
    j["moe"]["moe_intermediate_size"] = 32;
  });
  Layered<MoeFfn> s(config);
  const int64_t n = 96, d = 64;
  const std::vector<float> u = test::normal_floats(n * d, 4), dy = test::normal_floats(n * d, 5);
  std::vector<float> du32(static_cast<size_t>(n * d)), du16(static_cast<size_t>(n * d));
  s.store.zero_grads();
  forward(*s.layer, u, n, d, Precision::F32);
  s.layer->backward(dy.data(), du32.data());
  const std::vector<float> g32(s.store.grads(), s.store.grads() + s.store.numel());
  s.store.zero_grads();
  forward(*s.layer, u, n, d, Precision::BF16);
  s.layer->backward(dy.data(), du16.data());
  auto relative = [](const float* a, const float* b, int64_t count) {
    double err = 0.0, norm = 0.0;
    for (int64_t i = 0; i < count; ++i) err += std::pow(a[i] - b[i], 2), norm += std::pow(b[i], 2);
    return std::sqrt(err / norm);
  };
  EXPECT_LT(relative(du16.data(), du32.data(), n * d), 0.02);
  EXPECT_LT(relative(s.store.grads(), g32.data(), s.store.numel()), 0.02);
}

// A non-saving forward between a forward and its backward (an evaluation) leaves the saved state
// alone; a repeated step allocates no new gemm primitive.
TEST(Moe, EvaluationBetweenForwardAndBackward) {
  Layered<MoeFfn> s(tiny_config([](json& j) { j["moe"]["latent_dim"] = 8; }));
  const int64_t n = 24, d = s.d();
  const std::vector<float> u = test::normal_floats(n * d, 1), dy = test::normal_floats(n * d, 2);
  std::vector<float> du_plain(static_cast<size_t>(n * d)), du_interleaved(static_cast<size_t>(n * d));
  s.store.zero_grads();
  forward(*s.layer, u, n, d);
  s.layer->backward(dy.data(), du_plain.data());
  const std::vector<float> g_plain(s.store.grads(), s.store.grads() + s.store.numel());
  s.store.zero_grads();
  forward(*s.layer, u, n, d);
  forward(*s.layer, test::normal_floats(40 * d, 3), 40, d, Precision::F32, /*save=*/false);
  s.layer->backward(dy.data(), du_interleaved.data());
  EXPECT_EQ(du_plain, du_interleaved);
  EXPECT_EQ(g_plain, std::vector<float>(s.store.grads(), s.store.grads() + s.store.numel()));
  const int64_t primitives = gemm_primitives_created();
  forward(*s.layer, u, n, d);
  s.layer->backward(dy.data(), du_plain.data());
  EXPECT_EQ(gemm_primitives_created(), primitives) << "a repeated step created gemm primitives";
}

}  // namespace
}  // namespace hyla
