#pragma once
// Helpers for layer tests: a parameter store built from a config edited in JSON, random inputs,
// finite differences over parameters and inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hyla/io/json_fields.h"
#include "hyla/model/config.h"
#include "hyla/model/model.h"
#include "hyla/model/params.h"
#include "test_util.h"

namespace hyla::test {

// configs/nano.json with `edit` applied to its JSON.
inline ModelConfig nano_config(const std::function<void(nlohmann::json&)>& edit = {}) {
  nlohmann::json j = parse_json_file((source_dir() / "configs/nano.json").string());
  if (edit) edit(j);
  return ModelConfig::from_json(j, "nano-test");
}

inline std::vector<float> random_vector(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Gives every parameter random values of roughly its initialised scale (and exercises code paths a
// fresh init leaves trivial: AttnRes queries and biases start at 0, norms at 1).
inline void randomize_params(ParamStore& store, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (const auto& p : store.params()) {
    float* v = p->v();
    for (int64_t i = 0; i < p->numel(); ++i) {
      if (p->init == Init::Ones) v[i] = 1.0f + 0.2f * normal(rng);
      else if (p->init == Init::Zeros) v[i] = 0.3f * normal(rng);
      else if (p->init == Init::ALog || p->init == Init::DtBias) v[i] += 0.1f * normal(rng);
      else v[i] = 0.3f * normal(rng) / std::sqrt(float(p->shape[p->shape.ndim() - 1]));
    }
  }
  store.refresh_bf16();
}

// configs/kimi-k3-tiny.json (k3) or configs/kimi-linear-tiny.json at a tokenizer's vocabulary,
// initialised, then given random values (randomize_params with `seed`).
inline std::unique_ptr<Model> random_kimi_tiny(bool k3, int64_t vocab_size, unsigned seed) {
  nlohmann::json j =
      parse_json_file((source_dir() / (k3 ? "configs/kimi-k3-tiny.json" : "configs/kimi-linear-tiny.json")).string());
  j["vocab_size"] = vocab_size;
  auto model = std::make_unique<Model>(ModelConfig::from_json(j, k3 ? "kimi-k3-tiny" : "kimi-linear-tiny"));
  model->initialize(1);
  randomize_params(model->params(), seed);
  return model;
}

// Random token ids for packed sequences of `lengths`, each its own next-token target.
inline ModelInput random_input(const ModelConfig& c, const std::vector<int64_t>& lengths, unsigned seed) {
  ModelInput in;
  in.tokens = TokenBatch::packed(lengths);
  std::mt19937 rng(seed);
  for (int64_t r = 0; r < in.tokens.rows; ++r) in.ids.push_back(int32_t(rng() % uint32_t(c.vocab_size)));
  in.targets = in.ids;
  return in;
}

// max |a − b| over max |a| (f32 tensors of one size).
inline double max_relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, double(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
    scale = std::max(scale, double(std::fabs(a.data<float>()[i])));
  }
  return diff / scale;
}

}  // namespace hyla::test
