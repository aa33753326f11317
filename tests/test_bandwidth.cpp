#include <gtest/gtest.h>

#include <omp.h>

#include "hyla/kernels/bandwidth.h"

namespace hyla {
namespace {

// A token's reads as the roofline times them: the bytes it reads (slices and experts cut to whole
// 256-byte steps), a time split between the two kinds that adds up to the whole, and no routed
// time for a model without MoE layers.
TEST(TokenReadBench, ReadsTheTokensBytesAndSplitsTheirTime) {
  const int saved = omp_get_max_threads();
  for (const int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const TokenReadBench moe(int64_t(1) << 20, /*moe_layers=*/3, /*experts=*/8, /*expert_bytes=*/40'000);
    for (const int64_t picked : {1, 2, 8}) {
      const TokenReadTime t = moe.measure(600'000, picked);
      // 600,000 / 3 slices = 200,000 bytes = 781.25 steps; 40,000 bytes = 156.25 steps.
      EXPECT_EQ(t.reread_bytes, 3 * 781 * 256);
      EXPECT_EQ(t.routed_bytes, 3 * picked * 156 * 256);
      EXPECT_GT(t.reread_seconds, 0.0);
      EXPECT_GT(t.routed_seconds, 0.0);
      EXPECT_NEAR(t.reread_seconds + t.routed_seconds, t.seconds, 1e-9 * t.seconds);
    }
    const TokenReadBench dense(4096, /*moe_layers=*/0, 0, 0);
    const TokenReadTime t = dense.measure(100, 0);  // under one step: one step is read
    EXPECT_EQ(t.reread_bytes, 256);
    EXPECT_EQ(t.routed_bytes, 0);
    EXPECT_EQ(t.routed_seconds, 0.0);
    EXPECT_GT(t.seconds, 0.0);
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace hyla
