// KDA mixer (SPEC §3): forward vs a double-precision reference written from the spec, backward vs
// central finite differences of that reference, both gates; the cached forward (prefill in pieces,
// then decode) equals the full forward.
#include <gtest/gtest.h>

#include <cmath>
#include <array>
#include <functional>
#include <map>

#include "hyla/model/kda_mixer.h"
#include "model_test_util.h"
#include "spec_reference.h"

namespace hyla {
namespace {

using Doubles = std::vector<double>;
using test::ParamValues;

struct MixerSetup {
  ModelConfig config;
  ParamStore store;
  std::unique_ptr<KdaMixer> mixer;
  const std::string prefix = "model.layers.0.self_attn.";
  explicit MixerSetup(const ModelConfig& c) : config(c) {
    mixer = std::make_unique<KdaMixer>(store, prefix, config);
    store.allocate();
    test::randomize_params(store, 7);
  }
  ParamValues values() const {
    ParamValues out;
    for (const auto& p : store.params()) out[p->name] = Doubles(p->v(), p->v() + p->numel());
    return out;
  }
};

double max_relative(const std::vector<float>& a, const Doubles& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

void check_mixer(const std::function<void(nlohmann::json&)>& edit) {
  MixerSetup s(test::nano_config(edit));
  const std::vector<int64_t> lengths = {7, 19};
  const TokenBatch tokens = TokenBatch::packed(lengths);
  const int64_t N = tokens.rows, d = s.config.hidden_size;
  const std::vector<float> u = test::random_vector(size_t(N * d), 3);
  const std::vector<float> R = test::random_vector(size_t(N * d), 4);
  std::vector<float> y(size_t(N * d)), du(size_t(N * d));
  s.store.zero_grads();
  s.mixer->forward(u.data(), y.data(), {tokens, test::test_workspace(), Precision::F32, true});
  ParamValues w = s.values();
  const Doubles ud(u.begin(), u.end());
  EXPECT_LT(max_relative(y, test::reference_kda(s.config, {&w, s.prefix}, tokens.starts, ud)), 1e-4);
  s.mixer->backward(R.data(), du.data());

  auto loss = [&](ParamValues& weights, const Doubles& input) {
    const Doubles out = test::reference_kda(s.config, {&weights, s.prefix}, tokens.starts, input);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * R[i];
    return l;
  };
  const double eps = 1e-5;
  std::mt19937 rng(11);
  double du_scale = 0;
  for (float x : du) du_scale = std::max(du_scale, double(std::fabs(x)));
  for (int trial = 0; trial < 12; ++trial) {
    const size_t i = rng() % u.size();
    Doubles plus = ud, minus = ud;
    plus[i] += eps, minus[i] -= eps;
    const double fd = (loss(w, plus) - loss(w, minus)) / (2 * eps);
    EXPECT_NEAR(du[i], fd, 1e-3 * du_scale + 1e-6) << "du[" << i << "]";
  }
  for (const auto& p : s.store.params()) {
    double scale = 0;
    for (int64_t i = 0; i < p->numel(); ++i) scale = std::max(scale, double(std::fabs(p->g()[i])));
    for (int trial = 0; trial < 4; ++trial) {
      const size_t i = rng() % size_t(p->numel());
      ParamValues plus = w, minus = w;
      plus[p->name][i] += eps, minus[p->name][i] -= eps;
      const double fd = (loss(plus, ud) - loss(minus, ud)) / (2 * eps);
      EXPECT_NEAR(p->g()[i], fd, 1e-3 * scale + 1e-6) << p->name << "[" << i << "]";
    }
  }
}

TEST(KdaMixer, LowerBoundGateMatchesReferenceAndFiniteDifferences) {
  check_mixer([](nlohmann::json& j) { j["kda"]["gate"] = "lower_bound"; });
}
TEST(KdaMixer, SoftplusGateMatchesReferenceAndFiniteDifferences) {
  check_mixer([](nlohmann::json& j) { j["kda"]["gate"] = "softplus"; });
}
// Kimi K3: the decay logits through rank 16 (f_a_proj, f_b_proj), the lower-bounded gate.
TEST(KdaMixer, LowRankDecayGateMatchesReferenceAndFiniteDifferences) {
  check_mixer([](nlohmann::json& j) { j["kda"]["gate_rank"] = 16; });
}
// Kimi Linear: both gates low rank (ranks differ, so a swapped width would fail), softplus.
TEST(KdaMixer, LowRankDecayAndOutputGatesMatchReferenceAndFiniteDifferences) {
  check_mixer([](nlohmann::json& j) {
    j["kda"]["gate"] = "softplus";
    j["kda"]["gate_rank"] = 16;
    j["kda"]["output_gate_rank"] = 5;
  });
}

void check_cached(const ModelConfig& config) {
  MixerSetup s(config);
  const int64_t d = s.config.hidden_size, T = 40;
  const std::vector<int64_t> lengths = {T, 25};
  const TokenBatch full = TokenBatch::packed(lengths);
  const std::vector<float> u = test::random_vector(size_t(full.rows * d), 5);
  std::vector<float> y_full(u.size());
  s.mixer->forward(u.data(), y_full.data(), {full, test::test_workspace(), Precision::F32, false});

  // Two sequences with their own caches: prefill pieces of different sizes, then single tokens.
  std::vector<std::vector<float>> tails(2, std::vector<float>(size_t(s.mixer->conv_tail_floats()), 0.0f));
  std::vector<std::vector<float>> states(2, std::vector<float>(size_t(s.mixer->state_floats()), 0.0f));
  std::vector<float> y(u.size());
  int64_t done[2] = {0, 0};
  const std::vector<std::array<int64_t, 2>> steps = {{9, 3}, {17, 12}, {1, 1}, {5, 9}, {1, 0}, {7, 0}};
  for (auto step : steps) {
    std::vector<int64_t> n, offsets;
    std::vector<LayerCache> caches;
    std::vector<float> input;
    for (int b = 0; b < 2; ++b) {
      const int64_t take = std::min(step[size_t(b)], lengths[size_t(b)] - done[b]);
      if (take == 0) continue;
      n.push_back(take), offsets.push_back(done[b]);
      caches.push_back(RecurrentState{tails[size_t(b)].data(), states[size_t(b)].data()});
      const int64_t row0 = full.starts[size_t(b)] + done[b];
      input.insert(input.end(), u.begin() + row0 * d, u.begin() + (row0 + take) * d);
    }
    const TokenBatch tokens = TokenBatch::packed(n, offsets);
    std::vector<float> out(input.size());
    std::vector<LayerCache*> slots;
    for (LayerCache& c : caches) slots.push_back(&c);
    s.mixer->forward(input.data(), out.data(), {tokens, test::test_workspace(), Precision::F32, false}, slots);
    size_t at = 0;
    for (int b = 0; b < 2; ++b) {
      const int64_t take = std::min(step[size_t(b)], lengths[size_t(b)] - done[b]);
      if (take == 0) continue;
      const int64_t row0 = full.starts[size_t(b)] + done[b];
      std::copy(out.begin() + int64_t(at), out.begin() + int64_t(at) + take * d, y.begin() + row0 * d);
      at += size_t(take * d);
      done[b] += take;
    }
  }
  ASSERT_EQ(done[0], lengths[0]);
  ASSERT_EQ(done[1], lengths[1]);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    diff = std::max(diff, double(std::fabs(y[i] - y_full[i])));
    scale = std::max(scale, double(std::fabs(y_full[i])));
  }
  EXPECT_LT(diff / scale, 1e-5);
}

TEST(KdaMixer, CachedPrefillThenDecodeEqualsFullForward) { check_cached(test::nano_config()); }
TEST(KdaMixer, LowRankGatesCachedPrefillThenDecodeEqualsFullForward) {
  check_cached(test::nano_config([](nlohmann::json& j) {
    j["kda"]["gate_rank"] = 16;
    j["kda"]["output_gate_rank"] = 5;
  }));
}

}  // namespace
}  // namespace hyla
