#include "hyla/core/workspace.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>

#include "hyla/model/layer_buffer.h"

namespace hyla {
namespace {

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(Workspace, FramesGiveBackWhatTheyTook) {
  Arena arena;
  {
    Frame warm_up(arena);  // the first pass grows the arena; later ones reuse its one block
    warm_up.take<float>(64);
  }
  float* first;
  {
    Frame outer(arena);
    first = outer.take<float>(10);
    EXPECT_TRUE(aligned64(first));
    {
      Frame inner(arena);
      float* second = inner.take<float>(3);
      EXPECT_TRUE(aligned64(second));
      EXPECT_GE(second, first + 10);  // after the outer's buffer, never over it
    }
    Frame again(arena);
    EXPECT_EQ(again.take<float>(3), first + 16);  // the inner frame's space is reused
  }
  Frame next(arena);
  EXPECT_EQ(next.take<float>(10), first);
}

TEST(Workspace, OverflowKeepsLiveBuffersAndRegrowsToTheHighWaterMark) {
  Arena arena;
  {
    Frame f(arena);
    float* a = f.take<float>(100);
    for (int i = 0; i < 100; ++i) a[i] = float(i);
    float* b = f.take<float>(100000);  // past the first block: a new block, `a` stays put
    b[99999] = 1.0f;
    for (int i = 0; i < 100; ++i) ASSERT_EQ(a[i], float(i));
  }
  const size_t grown = arena.capacity();
  EXPECT_GE(grown, (112 + 100000) * sizeof(float));
  for (int pass = 0; pass < 3; ++pass) {  // the same pass again fits: no further growth
    Frame f(arena);
    f.take<float>(100);
    f.take<float>(100000);
  }
  EXPECT_EQ(arena.capacity(), grown);
}

TEST(Workspace, OneArenaPerThreadAndStableBytes) {
  Workspace workspace;
  auto pass = [&] {
    workspace.reserve();
#pragma omp parallel
    {
      Frame f(workspace.thread(omp_get_thread_num()));
      float* x = f.take<float>(1000 + 100 * omp_get_thread_num());
      x[0] = 1.0f;
    }
  };
  pass();
  const size_t bytes = workspace.bytes();
  EXPECT_GT(bytes, 0u);
  pass();
  EXPECT_EQ(workspace.bytes(), bytes);
}

TEST(Workspace, KeptActivationsOutliveTheForwardScratchDoesNot) {
  Workspace workspace;
  Arena kept;
  for (int warm_up = 0; warm_up < 2; ++warm_up) {
    LayerActivations a(kept, workspace, /*keep=*/true);
    a.take<float>(8);
  }
  float* saved;
  {
    LayerActivations a(kept, workspace, /*keep=*/true);
    saved = a.take<float>(8);
    saved[7] = 3.0f;
  }
  {
    LayerActivations scratch(kept, workspace, /*keep=*/false);  // an evaluation in between
    scratch.take<float>(8)[7] = -1.0f;
  }
  EXPECT_EQ(saved[7], 3.0f);  // the saved set is untouched
  {
    LayerActivations a(kept, workspace, /*keep=*/true);  // the next saving forward reuses it
    EXPECT_EQ(a.take<float>(8), saved);
  }
}

}  // namespace
}  // namespace hyla
