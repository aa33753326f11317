#pragma once
// Helpers for layer tests: a parameter store built from a config edited in JSON, random inputs,
// finite differences over parameters and inputs.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hyla/io/json_fields.h"
#include "hyla/model/config.h"
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

}  // namespace hyla::test
