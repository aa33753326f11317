// Latent attention mixer (model/mla_mixer.h, SPEC §4): forward against a double-precision
// reference written straight from the SPEC, backward against its central finite differences,
// forward_cached (chunked prefill, then decode) against the full forward, and bf16 bounds.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"
#include "hyla/model/mla_mixer.h"
#include "spec_reference.h"
#include "test_util.h"

namespace hyla {
namespace {

constexpr const char* kPrefix = "model.layers.1.self_attn.";

struct Options {
  int64_t q_lora, rope;
  bool gate;
  LayerType type;
  int64_t window;  // for Swa
  int64_t heads = 2;
  bool rotate = true;  // mla.rope: false keeps q_pe and k_pe unrotated (Kimi K3's NoPE with Dr > 0)
  bool per_head = false;  // mla.output_gate_per_head (Ling 3.0)
};

std::string describe(const Options& o) {
  return fmt::format("q_lora {}, rope {}{}, gate {}{}, {}{}, heads {}", o.q_lora, o.rope, o.rotate ? "" : " unrotated",
                     o.gate, o.per_head ? " per head" : "", to_string(o.type),
                     o.type == LayerType::Swa ? fmt::format(" {}", o.window) : "", o.heads);
}

// configs/nano.json (d 64, kv_lora 32, Dn 16, Dv 16) with the options applied. A larger init
// scale than SPEC's 0.02 gives attention scores of O(1), so the softmax is far from uniform.
ModelConfig make_config(const Options& o) {
  nlohmann::json j = parse_json_file((test::source_dir() / "configs/nano.json").string());
  j["initializer_range"] = 0.2;
  nlohmann::json& m = j["mla"];
  m["num_heads"] = o.heads;
  m["q_lora_rank"] = o.q_lora;
  m["qk_rope_head_dim"] = o.rope;
  m["output_gate"] = o.gate;
  m["output_gate_per_head"] = o.per_head;
  m["rope"] = o.rotate;
  m["sliding_window"] = o.type == LayerType::Swa ? o.window : 8;
  return ModelConfig::from_json(j, "configs/nano.json (test)");
}

// One registered, initialised layer. Norm weights are moved off 1 so that their use is tested.
struct Layer {
  ModelConfig config;
  LayerType type;
  ParamStore store;
  std::unique_ptr<MlaMixer> mixer;

  Layer(const Options& o, uint32_t seed) : config(make_config(o)), type(o.type) {
    mixer = std::make_unique<MlaMixer>(store, kPrefix, config, type);
    store.allocate();
    store.initialize(config, seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (const auto& p : store.params())
      if (p->name.find("layernorm") != std::string::npos)
        for (int64_t i = 0; i < p->numel(); ++i) p->v()[i] = 1.0f + 0.3f * normal(rng);
    store.refresh_bf16();
  }
  Layer(const Layer&) = delete;  // the mixer keeps a reference to `config`
  int64_t d() const { return config.hidden_size; }
};

// Parameters as doubles, by name without the layer prefix ("kv_b_proj.weight").
using Weights = test::ParamValues;

Weights weights_of(const ParamStore& store) {
  Weights w;
  for (const auto& p : store.params()) w[p->name.substr(std::strlen(kPrefix))].assign(p->v(), p->v() + p->numel());
  return w;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& e : x) e = scale * normal(rng);
  return x;
}

// max |a − b| / max |b|
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0, magnitude = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    magnitude = std::max(magnitude, std::abs(b[i]));
  }
  return worst / magnitude;
}

// Each option of SPEC §4 in both states: q_lora 0 / 16, RoPE off / 8, gate on / off / per head, "mla" and
// "swa" with windows 1, 3 and longer than every sequence, q_pe and k_pe rotated or not.
const std::vector<Options> kOptions = {
    {0, 0, true, LayerType::Mla, 0},    {16, 8, true, LayerType::Mla, 0},   {0, 8, false, LayerType::Swa, 3},
    {16, 0, false, LayerType::Swa, 1},  {0, 8, true, LayerType::Swa, 100},  {16, 8, true, LayerType::Swa, 3},
    {0, 8, true, LayerType::Mla, 0, 3},  {0, 8, true, LayerType::Mla, 0, 2, false},
    {16, 8, true, LayerType::Swa, 3, 2, false},
    {16, 8, true, LayerType::Mla, 0, 3, true, true},  {0, 0, true, LayerType::Mla, 0, 2, true, true},
};

// Packed sequences of different lengths; positions start at offsets (RoPE sees them, the causal
// mask counts within each sequence).
TokenBatch training_batch() { return TokenBatch::packed({7, 12, 1, 9}, {0, 5, 0, 1000}); }

TEST(Mla, ForwardMatchesDoubleReference) {
  const TokenBatch tokens = training_batch();
  uint32_t seed = 10;
  for (const Options& o : kOptions) {
    Layer layer(o, seed++);
    const auto u = random_floats(size_t(tokens.rows * layer.d()), seed++);
    std::vector<float> y(u.size(), NAN);
    layer.mixer->forward(u.data(), y.data(), {tokens, test::test_workspace()});
    const Weights w = weights_of(layer.store);
    const auto ref = test::reference_mla(layer.config, o.type, test::SpecWeights{&w, ""},
                                         std::vector<double>(u.begin(), u.end()), tokens);
    EXPECT_LE(relative_error(y, ref), 2e-6) << describe(o);
  }
}

TEST(Mla, BackwardMatchesFiniteDifferences) {
  const TokenBatch tokens = training_batch();
  uint32_t seed = 50;
  for (const Options& o : kOptions) {
    Layer layer(o, seed++);
    const int64_t n = tokens.rows * layer.d();
    const auto u = random_floats(size_t(n), seed++);
    const auto dy = random_floats(size_t(n), seed++);
    std::vector<float> y(static_cast<size_t>(n)), du(static_cast<size_t>(n), NAN);
    layer.store.zero_grads();
    layer.mixer->forward(u.data(), y.data(), {tokens, test::test_workspace(), Precision::F32, /*save_for_backward=*/true});
    layer.mixer->backward(dy.data(), du.data());

    const Weights w = weights_of(layer.store);
    const std::vector<double> ud(u.begin(), u.end());
    auto loss = [&](const Weights& wt, const std::vector<double>& x) {
      const auto yr = test::reference_mla(layer.config, o.type, test::SpecWeights{&wt, ""}, x, tokens);
      double l = 0;
      for (size_t i = 0; i < yr.size(); ++i) l += yr[i] * dy[i];
      return l;
    };
    constexpr double h = 1e-4;
    std::mt19937 rng(seed++);
    // Compares `analytic` with central differences at a sample of indices, relative to the
    // largest analytic entry of the tensor. The floor of 1e-6 is for gradients that are exactly 0
    // (with window 1 the softmax is constant, so q gets none) and come out as f32 rounding noise.
    auto check = [&](const std::string& name, const float* analytic, int64_t count, auto perturbed_loss) {
      double scale = 0, worst = 0;
      for (int64_t i = 0; i < count; ++i) scale = std::max(scale, double(std::abs(analytic[i])));
      std::vector<int64_t> sample;
      for (int k = 0; k < 12; ++k) sample.push_back(std::uniform_int_distribution<int64_t>(0, count - 1)(rng));
      for (int64_t i : sample) {
        const double fd = (perturbed_loss(i, h) - perturbed_loss(i, -h)) / (2 * h);
        worst = std::max(worst, std::abs(fd - analytic[i]));
      }
      EXPECT_LE(worst, 1e-5 * scale + 1e-6) << name << " (" << describe(o) << ")";
    };
    check("u", du.data(), n, [&](int64_t i, double step) {
      std::vector<double> x = ud;
      x[size_t(i)] += step;
      return loss(w, x);
    });
    for (const auto& p : layer.store.params()) {
      const std::string name = p->name.substr(std::strlen(kPrefix));
      check(name, p->g(), p->numel(), [&](int64_t i, double step) {
        Weights wt = w;
        wt[name][size_t(i)] += step;
        return loss(wt, ud);
      });
    }
  }
}

// bf16 products (projections, and attention when not saving for backward) against f32. Each
// product rounds its two inputs to bf16 (relative error ≤ 2^-9 each); along the chain input
// projection → kv_b → attention (two products) → o_proj that gives ~1e-2 of the output's scale
// at worst, with typical errors several times smaller. Bound: 2e-2.
TEST(Mla, Bf16ForwardStaysCloseToF32) {
  const TokenBatch tokens = training_batch();
  uint32_t seed = 90;
  for (const Options& o : kOptions) {
    Layer layer(o, seed++);
    const auto u = random_floats(size_t(tokens.rows * layer.d()), seed++);
    std::vector<float> y32(u.size()), y16(u.size());
    layer.mixer->forward(u.data(), y32.data(), {tokens, test::test_workspace()});
    const std::vector<double> ref(y32.begin(), y32.end());
    for (bool save : {false, true}) {
      layer.mixer->forward(u.data(), y16.data(), {tokens, test::test_workspace(), Precision::BF16, save});
      EXPECT_LE(relative_error(y16, ref), 2e-2) << describe(o) << (save ? " saving" : "");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// forward_cached

struct CacheSet {
  int64_t width;
  bool bf16_rows;
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<bf16>> bf;
  std::vector<LayerCache> views;

  CacheSet(int64_t width_, bool bf16_, const std::vector<int64_t>& capacities) : width(width_), bf16_rows(bf16_) {
    for (int64_t c : capacities) {
      f32.emplace_back(bf16_rows ? 0 : size_t(c * width));
      bf.emplace_back(bf16_rows ? size_t(c * width) : 0);
    }
    for (size_t b = 0; b < capacities.size(); ++b) {
      LatentCache v;
      if (bf16_rows) v.latent_bf16 = bf[b].data();
      else v.latent_f32 = f32[b].data();
      v.capacity = capacities[b];
      views.push_back(v);
    }
  }
  int64_t length(size_t b) const { return std::get<LatentCache>(views[b]).length; }
  CacheSet(const CacheSet& o) : width(o.width), bf16_rows(o.bf16_rows), f32(o.f32), bf(o.bf), views(o.views) {
    for (size_t b = 0; b < views.size(); ++b) {
      std::get<LatentCache>(views[b]).latent_bf16 = bf16_rows ? bf[b].data() : nullptr;
      std::get<LatentCache>(views[b]).latent_f32 = bf16_rows ? nullptr : f32[b].data();
    }
  }
};

// Runs one forward_cached call on the sequences `which` with `counts` new tokens each, taking u
// rows from the full batch; returns y for those tokens, in batch order.
std::vector<float> cached_step(Layer& layer, CacheSet& caches, const std::vector<int64_t>& which,
                               const std::vector<int64_t>& counts, const TokenBatch& full, const std::vector<float>& u,
                               Precision p, MlaMixer::DecodePath path = MlaMixer::DecodePath::Absorbed,
                               std::vector<int64_t>* full_rows = nullptr) {
  const int64_t d = layer.d();
  std::vector<int64_t> offsets;
  std::vector<LayerCache*> slots;
  for (int64_t b : which) {
    offsets.push_back(std::get<LatentCache>(caches.views[size_t(b)]).length);
    slots.push_back(&caches.views[size_t(b)]);
  }
  const TokenBatch tokens = TokenBatch::packed(counts, offsets);
  std::vector<float> x(size_t(tokens.rows * d)), y(size_t(tokens.rows * d), NAN);
  for (size_t s = 0; s < which.size(); ++s)
    for (int64_t i = 0; i < counts[s]; ++i) {
      const int64_t from = full.starts[size_t(which[s])] + offsets[s] + i;
      std::copy_n(u.begin() + from * d, d, x.begin() + (tokens.starts[s] + i) * d);
      if (full_rows) full_rows->push_back(from);
    }
  layer.mixer->forward(x.data(), y.data(), {tokens, test::test_workspace(), p}, slots, path);
  return y;
}

// Prefill in uneven chunks (prefill and decode sequences mixed in one call, sequences with no new
// token), then token-by-token decode of all sequences at once; every output against the full
// forward's row.
double prefill_then_decode_error(Layer& layer, bool bf16_cache, Precision p) {
  const std::vector<int64_t> lengths = {30, 14, 45};
  const TokenBatch full = TokenBatch::packed(lengths);
  const int64_t d = layer.d();
  const auto u = random_floats(size_t(full.rows * d), 7);
  std::vector<float> y_full(u.size());
  layer.mixer->forward(u.data(), y_full.data(), {full, test::test_workspace()});
  double magnitude = 0;
  for (float v : y_full) magnitude = std::max(magnitude, double(std::abs(v)));

  CacheSet caches(layer.mixer->cache_width(), bf16_cache, {32, 16, 47});
  double worst = 0;
  auto run = [&](const std::vector<int64_t>& counts) {
    std::vector<int64_t> which, n;
    for (size_t b = 0; b < counts.size(); ++b) {
      which.push_back(int64_t(b));
      n.push_back(std::min(counts[b], lengths[b] - caches.length(b)));
    }
    std::vector<int64_t> rows;
    const auto y = cached_step(layer, caches, which, n, full, u, p, MlaMixer::DecodePath::Absorbed, &rows);
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t j = 0; j < d; ++j)
        worst = std::max(worst, double(std::abs(y[r * d + j] - y_full[size_t(rows[r] * d + j)])));
  };
  for (const auto& counts : std::vector<std::vector<int64_t>>{{5, 1, 17}, {17, 3, 1}, {1, 1, 20}, {0, 4, 1}})
    run(counts);
  for (int step = 0; step < 8; ++step) run({1, 1, 1});
  for (size_t b = 0; b < lengths.size(); ++b) EXPECT_EQ(caches.length(b), lengths[b]);
  return worst / magnitude;
}

TEST(MlaCached, PrefillChunksThenDecodeMatchFullForward) {
  uint32_t seed = 120;
  for (const Options& o : kOptions) {
    Layer layer(o, seed++);
    EXPECT_LE(prefill_then_decode_error(layer, false, Precision::F32), 1e-5) << describe(o) << ", f32 cache";
    // A bf16 cache rounds c and k_pe (relative error ≤ 2^-9 per value, ~2^-10 typical); keys,
    // values and scores inherit errors of that size, and the largest over all outputs reaches a few
    // times 2^-9 (measured 3.4e-3). Bound: 1e-2.
    EXPECT_LE(prefill_then_decode_error(layer, true, Precision::F32), 1e-2) << describe(o) << ", bf16 cache";
  }
}

// bf16 products everywhere in the cached path (projections, the prefill attention) on a bf16
// cache: the training bound of Bf16ForwardStaysCloseToF32 applies.
TEST(MlaCached, Bf16PrecisionStaysCloseToF32) {
  uint32_t seed = 140;
  for (const Options& o : kOptions) {
    Layer layer(o, seed++);
    EXPECT_LE(prefill_then_decode_error(layer, true, Precision::BF16), 2e-2) << describe(o);
  }
}

double max_difference(const std::vector<float>& a, const float* b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

// One decode call for several sequences against one call per sequence, and the absorbed decode
// against the up-projected one, from the same prefilled caches.
TEST(MlaCached, BatchedDecodeEqualsPerSequenceAndUpProjectedDecode) {
  const std::vector<int64_t> lengths = {12, 70, 7};
  uint32_t seed = 160;
  for (const Options& o : kOptions)
    for (bool bf16_cache : {false, true}) {
      Layer layer(o, seed++);
      const int64_t d = layer.d();
      const TokenBatch full = TokenBatch::packed(lengths);
      const auto u = random_floats(size_t(full.rows * d), seed++);
      CacheSet caches(layer.mixer->cache_width(), bf16_cache, lengths);
      cached_step(layer, caches, {0, 1, 2}, {11, 69, 6}, full, u, Precision::F32);
      const CacheSet prefilled = caches;
      const auto y = cached_step(layer, caches, {0, 1, 2}, {1, 1, 1}, full, u, Precision::F32);
      double magnitude = 0;
      for (float v : y) magnitude = std::max(magnitude, double(std::abs(v)));
      for (int64_t b = 0; b < 3; ++b) {
        CacheSet alone = prefilled;
        const auto yb = cached_step(layer, alone, {b}, {1}, full, u, Precision::F32);
        EXPECT_LE(max_difference(yb, y.data() + b * d, size_t(d)), 1e-6 * magnitude) << describe(o) << ", sequence " << b;
        EXPECT_EQ(alone.length(size_t(b)), lengths[size_t(b)]);
      }
      CacheSet up = prefilled;
      const auto y_up = cached_step(layer, up, {0, 1, 2}, {1, 1, 1}, full, u, Precision::F32,
                                    MlaMixer::DecodePath::UpProjected);
      EXPECT_LE(max_difference(y_up, y.data(), y.size()), 1e-5 * magnitude) << describe(o);
    }
}

TEST(MlaCached, RejectsBadCachesAndPositions) {
  Layer layer({0, 8, true, LayerType::Mla, 0}, 3);
  const int64_t d = layer.d();
  const std::vector<float> u(size_t(4 * d), 0.5f);
  std::vector<float> y(u.size());
  std::vector<float> rows(size_t(4 * layer.mixer->cache_width()));
  LayerCache slot = LatentCache{nullptr, rows.data(), 0, 3};
  LatentCache& cache = std::get<LatentCache>(slot);
  LayerCache* one_slot = &slot;
  std::span<LayerCache* const> one(&one_slot, 1);
  const TokenBatch four = TokenBatch::packed({4});
  EXPECT_THROW(layer.mixer->forward(u.data(), y.data(), {four, test::test_workspace()}, one), Error);  // over capacity
  cache.capacity = 4;
  const TokenBatch shifted = TokenBatch::packed({2}, {1});
  EXPECT_THROW(layer.mixer->forward(u.data(), y.data(), {shifted, test::test_workspace()}, one), Error);  // positions 1, 2 on an empty cache
  const TokenBatch two = TokenBatch::packed({2});
  layer.mixer->forward(u.data(), y.data(), {two, test::test_workspace()}, one);
  EXPECT_EQ(cache.length, 2);
  EXPECT_THROW(layer.mixer->backward(y.data(), y.data()), Error);  // nothing saved for backward
}

}  // namespace
}  // namespace hyla
