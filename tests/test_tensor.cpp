#include <gtest/gtest.h>

#include "hyla/core/tensor.h"

namespace hyla {
namespace {

TEST(Tensor, ShapesViewsAndConversion) {
  Tensor t = Tensor::zeros(DType::F32, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = float(i) + 0.5f;
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 4}));
  EXPECT_EQ(r.data<float>()[0], 4.5f);
  Tensor flat = t.reshape({12});
  EXPECT_EQ(flat.data<float>()[11], 11.5f);
  EXPECT_THROW(t.reshape({5}), Error);
  EXPECT_THROW(t.data<bf16>(), Error);
  Tensor b = t.to(DType::BF16);
  Tensor h = b.to(DType::F16);
  Tensor back = h.to(DType::F32);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(back.data<float>()[i], float(i) + 0.5f);
  EXPECT_THROW(Tensor::zeros(DType::I32, {2}).to(DType::F32), Error);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5}), Error);
  EXPECT_EQ((Shape{2, 3}).str(), "[2, 3]");
}

TEST(Tensor, ViewKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(8, 2.0f);
  Tensor v = Tensor::view(DType::F32, {8}, owner->data(), owner);
  owner.reset();
  EXPECT_EQ(v.data<float>()[7], 2.0f);
}

}  // namespace
}  // namespace hyla
