#include <gtest/gtest.h>

#include <thread>

#include "hyla/core/error.h"
#include "hyla/core/threads.h"

namespace hyla {
namespace {

TEST(Threads, PassingThreadKeepsTheThreadCountAndRethrows) {
  const int before = num_threads();
  set_threads(3);
  int seen = 0;
  std::thread::id ran_on;
  run_on_passing_thread([&] {
    seen = num_threads();
    ran_on = std::this_thread::get_id();
  });
  EXPECT_EQ(seen, 3);
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_THROW(run_on_passing_thread([] { HYLA_CHECK(false, "from the passing thread"); }), Error);
  set_threads(before);
}

TEST(Threads, ResolveThreadsPrefersTheRequestThenTheEnvironment) {
  EXPECT_EQ(resolve_threads(5), 5);
  EXPECT_GE(resolve_threads(0), 1);
  EXPECT_TRUE(worth_parallel(kParallelGrain));
  EXPECT_FALSE(worth_parallel(kParallelGrain - 1));
}

}  // namespace
}  // namespace hyla
