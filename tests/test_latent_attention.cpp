// Latent-cache decode attention (kernels/latent_attention.h) against a double-precision reference,
// and the vector helpers it is built on.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/kernels/cpu/vec.h"
#include "hyla/kernels/latent_attention.h"
#include "reference_ops.h"

namespace hyla {
namespace {

TEST(VecSumEach, LaneIHoldsTheSumOfInputI) {
  vec::Vec v[16];
  float expected[16];
  for (int i = 0; i < 16; ++i) {
    float lanes[16];
    expected[i] = 0.0f;
    for (int j = 0; j < 16; ++j) expected[i] += lanes[j] = float(100 * i + j);
    v[i] = vec::load(lanes);
  }
  float out[16];
  vec::store(out, vec::sum_each(v));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], expected[i]) << i;
}

TEST(VecSumHalves, LaneOHoldsTheTotalOfOutputO) {
  // w[2b + c]: low half 8 partial sums of output b + 8c, high half of output b + 4 + 8c.
  vec::Vec w[8];
  float expected[16] = {};
  for (int b = 0; b < 4; ++b)
    for (int c = 0; c < 2; ++c) {
      float lanes[16];
      for (int i = 0; i < 16; ++i) {
        const int output = b + 8 * c + (i < 8 ? 0 : 4);
        expected[output] += lanes[i] = float(1000 * output + i);
      }
      w[2 * b + c] = vec::load(lanes);
    }
  float out[16];
  vec::store(out, vec::sum_halves(w));
  for (int o = 0; o < 16; ++o) EXPECT_EQ(out[o], expected[o]) << o;
}

TEST(VecLoadBf16, WidensExactlyAndZeroesMaskedLanes) {
  bf16 x[16];
  for (int i = 0; i < 16; ++i) x[i] = to_bf16(float(i) * 0.37f - 2.0f);
  float out[16];
  vec::store(out, vec::load_bf16(x, vec::lane_range(0, 11)));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], i < 11 ? to_f32(x[i]) : 0.0f) << i;
}

struct Case {
  int64_t heads, latent, rope, window;
  std::vector<int64_t> lengths;
};

struct Caches {
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<bf16>> bf;
};

// Runs one case with f32 and bf16 rows (and bf16 products where the latent width allows); the bf16
// runs are compared with the reference on the same (rounded) rows. f32 arithmetic must agree to
// f32 rounding. bf16 products round the query and the probabilities to bf16 (2^-9 relative):
// scores move by ~2^-9 of their size, and the output by a few times 2^-9 of its scale. Bound: 1e-2.
void check(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  const int64_t K = c.latent + c.rope, B = int64_t(c.lengths.size());
  const float scale = 1.0f / std::sqrt(float(c.latent));
  Caches caches;
  for (int64_t L : c.lengths) {
    std::vector<float> rows(size_t(L * K));
    for (float& x : rows) x = normal(rng);
    std::vector<bf16> rows16(rows.size());
    convert(rows.data(), rows16.data(), rows.size());
    caches.f32.push_back(std::move(rows));
    caches.bf.push_back(std::move(rows16));
  }
  std::vector<float> q(size_t(B * c.heads * K));
  for (float& x : q) x = 1.5f * normal(rng);  // sharp enough that the softmax is far from uniform
  Workspace ws;
  const LatentAttentionDims dims{c.heads, c.latent, c.rope, c.window, scale};
  for (int run = 0; run < 3; ++run) {
    const bool bf16_rows = run > 0, bf16_products = run == 2;
    if (bf16_products && c.latent % 32 != 0) continue;
    std::vector<LatentCacheRows> views;
    for (int64_t b = 0; b < B; ++b) {
      LatentCacheRows v;
      if (bf16_rows) v.rows_bf16 = caches.bf[size_t(b)].data();
      else v.rows_f32 = caches.f32[size_t(b)].data();
      v.length = c.lengths[size_t(b)];
      views.push_back(v);
    }
    std::vector<float> o(size_t(B * c.heads * c.latent), NAN);
    LatentAttentionDims run_dims = dims;
    run_dims.bf16_products = bf16_products;
    latent_attention_decode(run_dims, B, views.data(), q.data(), o.data(), ws);
    std::vector<float> ref(o.size());
    reference::latent_attention_decode(run_dims, B, views.data(), q.data(), ref.data(), ws);
    double worst = 0, magnitude = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      worst = std::max(worst, std::abs(double(o[i]) - ref[i]));
      magnitude = std::max(magnitude, std::abs(double(ref[i])));
    }
    EXPECT_LE(worst, (bf16_products ? 1e-2 : 2e-6) * std::max(magnitude, 1.0))
        << "heads " << c.heads << " latent " << c.latent << " rope " << c.rope << " window " << c.window
        << (bf16_products ? " bf16 products" : bf16_rows ? " bf16 rows" : " f32");
  }
}

TEST(LatentAttention, MatchesDoubleReference) {
  const std::vector<Case> cases = {
      {8, 128, 0, 0, {1, 5, 64, 65, 300}},       // the small config's shape, lengths around a tile
      {2, 32, 8, 0, {3, 17, 200}},                // nano: 2 heads (8 rows per score block)
      {3, 40, 8, 0, {129, 2}},                    // heads padded to 4; rows not whole vectors
      {1, 16, 0, 0, {7, 1000}},                   // one head (padded to 2)
      {12, 48, 16, 0, {70, 3}},                   // more heads than a score block: 16 padded heads
      {24, 32, 0, 0, {33}},                       // padded heads an odd multiple of 8
      {8, 128, 8, 5, {1, 4, 5, 6, 200}},          // sliding window
      {4, 64, 0, 1, {10, 1}},                     // window of one row
      {8, 64, 0, 0, {5000}},                      // several units merged
      {5, 96, 8, 0, {63, 64, 1}},                 // odd row counts in a tile (bf16 products pair rows)
      {16, 32, 0, 3, {40}},                       // bf16 products, 16 heads in two value blocks
      {8, 32, 24, 0, {70, 5}},                    // row of 28 pair words: a partial step of 8
      // Rows of a multiple of 32 values take AMX tiles for bf16 products where the CPU has them
      // (so do the cases above with K = 128, 32 and 64): two head groups, the second partial, and
      // steps of 64 rows cut by the unit's end.
      {17, 64, 32, 0, {63, 64, 65, 129, 1}},
      {4, 64, 0, 0, {63, 64, 65, 1300}},  // groups of 4 heads (the long-context configs' shape)
      {3, 64, 0, 0, {100}},               // a padding head in a group of 4
      {6, 32, 32, 0, {70, 2}},            // groups of 8 with padding heads, rope values in the rows
  };
  uint32_t seed = 1;
  for (const Case& c : cases) check(c, seed++);
}

TEST(LatentAttention, EmptyCacheGivesZero) {
  std::vector<float> rows(64, 1.0f), q(2 * 2 * 32, 1.0f), o(2 * 2 * 32, NAN);
  const LatentCacheRows caches[2] = {{nullptr, rows.data(), 0}, {nullptr, rows.data(), 2}};
  Workspace ws;
  latent_attention_decode({2, 32, 0, 0, 0.1f}, 2, caches, q.data(), o.data(), ws);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(o[size_t(i)], 0.0f);
  for (int i = 64; i < 128; ++i) EXPECT_FLOAT_EQ(o[size_t(i)], 1.0f);
}

TEST(LatentAttention, ThreadCountDoesNotChangeResults) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const int64_t H = 8, R = 64, L = 3000;
  std::vector<float> rows(size_t(L * R)), q(size_t(H * R));
  for (float& x : rows) x = normal(rng);
  for (float& x : q) x = normal(rng);
  const LatentCacheRows cache{nullptr, rows.data(), L};
  Workspace ws;
  std::vector<float> one(size_t(H * R)), two(size_t(H * R));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  latent_attention_decode({H, R, 0, 0, 0.125f}, 1, &cache, q.data(), one.data(), ws);
  omp_set_num_threads(std::max(saved, 2));
  latent_attention_decode({H, R, 0, 0, 0.125f}, 1, &cache, q.data(), two.data(), ws);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

// One thread: pieces are claimed by whichever thread is free, and a thread's arena grows the first
// time it takes one, so with more threads the pass at which growth stops is a race (CI saw a
// second thread's first piece arrive on the second pass).
TEST(LatentAttention, WorkspaceStopsGrowing) {
  std::vector<float> rows(size_t(500 * 40), 0.5f), q(size_t(3 * 40), 0.1f), o(size_t(3 * 32));
  const LatentCacheRows cache{nullptr, rows.data(), 500};
  Workspace ws;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  latent_attention_decode({3, 32, 8, 0, 0.2f}, 1, &cache, q.data(), o.data(), ws);
  const size_t bytes = ws.bytes();
  latent_attention_decode({3, 32, 8, 0, 0.2f}, 1, &cache, q.data(), o.data(), ws);
  omp_set_num_threads(saved);
  EXPECT_EQ(ws.bytes(), bytes);
}

TEST(LatentAttention, RejectsMixedDtypesAndBf16ProductsOnF32Rows) {
  std::vector<float> rows(32, 0.0f), q(64, 0.0f), o(64);
  std::vector<bf16> rows16(32);
  const LatentCacheRows caches[2] = {{nullptr, rows.data(), 1}, {rows16.data(), nullptr, 1}};
  Workspace ws;
  EXPECT_THROW(latent_attention_decode({1, 32, 0, 0, 1.0f}, 2, caches, q.data(), o.data(), ws), Error);
  EXPECT_THROW(latent_attention_decode({1, 32, 0, 0, 1.0f, true}, 1, caches, q.data(), o.data(), ws), Error);
}

}  // namespace
}  // namespace hyla
