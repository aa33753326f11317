// MoonViT (SPEC §7.2): the position grid's resampling against PyTorch's F.interpolate, and the
// whole tower and projector against a plain double-precision reference written from SPEC, in both
// of its variants (Kimi K2.5's and Kimi K3's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/kernels/resample.h"
#include "hyla/model/moonvit.h"
#include "spec_reference.h"
#include "test_util.h"

namespace hyla {
namespace {

// A tower's options as these tests vary them: vision.moonvit, the patch size and the output width.
struct Config : MoonVitConfig {
  int64_t patch_size = 2, channels = 3, text_hidden_size = 20;
  int64_t patch_values() const { return channels * patch_size * patch_size; }
  VisionConfig vision() const {
    VisionConfig v;
    v.enabled = true, v.tower = VisionTower::MoonVit, v.patch_size = patch_size, v.channels = channels;
    v.moonvit = *this;
    return v;
  }
};
using Grid = std::vector<double>;  // [rows, cols, channels]

// ---- the position grid ----

TEST(ResampleGrid, MatchesPyTorchInterpolate) {
  std::ifstream in(test::source_dir() / "tests/data/resample_torch.json");
  ASSERT_TRUE(in) << "tests/data/resample_torch.json";
  const nlohmann::json j = nlohmann::json::parse(in);
  const int64_t h = j["src_shape"][0], w = j["src_shape"][1], c = j["src_shape"][2];
  const std::vector<float> src = j["src"].get<std::vector<float>>();
  for (const auto& t : j["cases"]) {
    const std::string mode = t["mode"];
    const int64_t oh = t["shape"][0], ow = t["shape"][1];
    SCOPED_TRACE(mode + " to " + std::to_string(oh) + "x" + std::to_string(ow));
    const std::vector<double> want = t["values"].get<std::vector<double>>();
    std::vector<float> got(size_t(oh * ow * c), NAN);
    resample_grid(mode == "bicubic" ? GridResample::Bicubic : GridResample::Bilinear, src.data(), h, w, c, got.data(),
                  oh, ow);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-6) << "at " << i;
  }
}

TEST(ResampleGrid, BackwardIsTheTranspose) {
  // <dy, R x> = <Rᵀ dy, x> for random x and dy, up and down in both modes.
  for (const GridResample mode : {GridResample::Bicubic, GridResample::Bilinear})
    for (const auto& [oh, ow] : {std::pair{int64_t(7), int64_t(9)}, std::pair{int64_t(2), int64_t(3)}}) {
      const int64_t h = 4, w = 5, c = 3;
      const std::vector<float> x = test::normal_floats(h * w * c, 1), dy = test::normal_floats(oh * ow * c, 2);
      std::vector<float> y(size_t(oh * ow * c)), dx(size_t(h * w * c), 0.0f);
      resample_grid(mode, x.data(), h, w, c, y.data(), oh, ow);
      resample_grid_backward(mode, dy.data(), oh, ow, c, dx.data(), h, w);
      double forward = 0, backward = 0;
      for (size_t i = 0; i < y.size(); ++i) forward += double(dy[i]) * y[i];
      for (size_t i = 0; i < x.size(); ++i) backward += double(dx[i]) * x[i];
      EXPECT_NEAR(forward, backward, 1e-4 * std::max(1.0, std::abs(forward)));
    }
}

TEST(ResampleGrid, SameSizeIsTheIdentity) {
  const std::vector<float> x = test::normal_floats(3 * 4 * 2, 3);
  for (const GridResample mode : {GridResample::Bicubic, GridResample::Bilinear}) {
    std::vector<float> y(x.size());
    resample_grid(mode, x.data(), 3, 4, 2, y.data(), 3, 4);
    EXPECT_EQ(y, x);
  }
}


// ---- the tower against SPEC's double reference (tests/spec_reference.h) ----

// The store's values in double (finite differences perturb them there).
test::ParamValues values_of(const ParamStore& store) {
  test::ParamValues values;
  for (const auto& p : store.params()) values[p->name].assign(p->v(), p->v() + p->numel());
  return values;
}

std::vector<double> reference(const Config& c, const test::ParamValues& values, const TowerImage& img) {
  const int64_t n = img.grid_rows * img.grid_cols;
  return test::reference_moonvit(c.vision(), c.text_hidden_size, values, img.grid_rows, img.grid_cols,
                                 std::vector<double>(img.patches, img.patches + n * c.patch_values()));
}

Config k25_like() {
  Config c;
  c.hidden_size = 24, c.num_heads = 2, c.head_dim = 12, c.num_layers = 2, c.intermediate_size = 40;
  c.pos_emb_height = 4, c.pos_emb_width = 6;
  return c;
}

Config k3_like() {
  Config c = k25_like();
  c.num_heads = 3, c.head_dim = 16;  // the attention's width (48) differs from the tower's (24), as in K3
  c.norm = VisionNorm::RmsNorm, c.norm_eps = 1.0 / 128, c.bias = false;
  c.pos_emb_resample = GridResample::Bilinear, c.projector = VisionProjector::PatchMergerV2;
  return c;
}

// Both published variants, and K2.5's with the projector's GELU in tanh form (llama.cpp's graph).
std::vector<std::pair<std::string, Config>> variants() {
  Config tanh_projector = k25_like();
  tanh_projector.projector_gelu = Gelu::Tanh;
  return {{"K2.5-like", k25_like()}, {"K2.5-like, tanh projector", tanh_projector}, {"K3-like", k3_like()}};
}

// Random values of every parameter: norms near 1, the rest at a scale that keeps activations O(1).
void randomize(ParamStore& store, uint32_t seed) {
  for (const auto& p : store.params()) {
    const bool is_norm = p->name.find("norm") != std::string::npos && p->name.ends_with(".weight");
    const float scale = is_norm ? 0.1f : 0.6f / std::sqrt(float(p->shape[p->shape.ndim() - 1]));
    const std::vector<float> v = test::normal_floats(p->numel(), ++seed, scale, is_norm ? 1.0f : 0.0f);
    std::copy(v.begin(), v.end(), p->v());
  }
}

double scaled_error(const float* got, const std::vector<double>& want) {
  double err = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    if (std::isnan(got[i])) err = INFINITY;
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

TEST(MoonVit, MatchesTheDoubleReferenceInBothVariants) {
  for (const auto& [name, c] : variants()) {
    SCOPED_TRACE(name);
    ParamStore store;
    MoonVit tower(store, c.vision(), c.text_hidden_size);
    store.allocate();
    randomize(store, 11);
    // One image at the learned grid's own size, one taller and narrower (resized both ways), one
    // of a single merged token.
    const std::vector<std::pair<int64_t, int64_t>> grids = {{4, 6}, {8, 2}, {2, 2}};
    std::vector<std::vector<float>> pixels;
    std::vector<TowerImage> images;
    uint32_t seed = 40;
    for (const auto& [rows, cols] : grids) {
      pixels.push_back(test::normal_floats(rows * cols * c.patch_values(), ++seed));
      images.push_back({rows, cols, pixels.back().data()});
    }
    int64_t tokens = 0;
    for (const TowerImage& img : images) tokens += tower.tokens(img);
    EXPECT_EQ(tokens, 6 + 4 + 1);
    std::vector<float> out(size_t(tokens * c.text_hidden_size), NAN);
    tower.forward(images, out.data(), Precision::F32, test::test_workspace());
    int64_t row = 0;
    for (size_t i = 0; i < images.size(); ++i) {
      SCOPED_TRACE("image " + std::to_string(i));
      const std::vector<double> want = reference(c, values_of(store), images[i]);
      EXPECT_LE(scaled_error(out.data() + row * c.text_hidden_size, want), 2e-5);
      row += tower.tokens(images[i]);
    }
    // Each image alone gives what it gave in the batch: images attend only within themselves.
    std::vector<float> alone(size_t(tower.tokens(images[1]) * c.text_hidden_size));
    tower.forward({&images[1], 1}, alone.data(), Precision::F32, test::test_workspace());
    for (size_t i = 0; i < alone.size(); ++i)
      EXPECT_NEAR(alone[i], out[size_t(6 * c.text_hidden_size) + i], 1e-5) << i;
  }
}

TEST(MoonVit, GradientsMatchFiniteDifferences) {
  for (const auto& [name, c] : variants()) {
    SCOPED_TRACE(name);
    ParamStore store;
    MoonVit tower(store, c.vision(), c.text_hidden_size);
    store.allocate();
    randomize(store, 21);
    store.zero_grads();
    // The learned grid's own size and a resized one, in one batch.
    const std::vector<float> a = test::normal_floats(4 * 6 * c.patch_values(), 1),
                             b = test::normal_floats(2 * 4 * c.patch_values(), 2);
    const std::vector<TowerImage> images = {{4, 6, a.data()}, {2, 4, b.data()}};
    const int64_t tokens = tower.tokens(images[0]) + tower.tokens(images[1]);
    const std::vector<float> d_out = test::normal_floats(tokens * c.text_hidden_size, 3);
    std::vector<float> out(d_out.size());
    tower.forward(images, out.data(), Precision::F32, test::test_workspace(), /*save=*/true);
    tower.backward(d_out.data(), test::test_workspace());

    test::ParamValues weights = values_of(store);
    auto loss = [&] {
      double total = 0;
      size_t i = 0;
      for (const TowerImage& img : images)
        for (double y : reference(c, weights, img)) total += d_out[i++] * y;
      return total;
    };
    for (const auto& p : store.params()) {
      const int64_t numel = p->numel();
      std::vector<int64_t> entries = {0, numel / 3, 2 * numel / 3 + 1, numel - 1};
      entries.erase(std::remove_if(entries.begin(), entries.end(), [&](int64_t e) { return e >= numel; }),
                    entries.end());
      const float* g = p->g();
      EXPECT_GT(test::expect_gradients(p->name, loss, weights.at(p->name),
                                       [&](int64_t e) { return double(g[e]); }, entries),
                0.0)
          << p->name << ": the entries tested nothing";
    }
  }
}

// bf16 products (inference's precision) stay within bf16's rounding of the f32 forward.
TEST(MoonVit, Bf16ProductsStayCloseToF32) {
  const Config c = k3_like();
  ParamStore store;
  MoonVit tower(store, c.vision(), c.text_hidden_size);
  store.allocate();
  randomize(store, 31);
  store.refresh_bf16();
  const std::vector<float> pixels = test::normal_floats(4 * 6 * c.patch_values(), 4);
  const TowerImage image{4, 6, pixels.data()};
  std::vector<float> f32(size_t(tower.tokens(image) * c.text_hidden_size)), bf16(f32.size());
  tower.forward({&image, 1}, f32.data(), Precision::F32, test::test_workspace());
  tower.forward({&image, 1}, bf16.data(), Precision::BF16, test::test_workspace());
  const std::vector<double> want(f32.begin(), f32.end());
  EXPECT_LT(scaled_error(bf16.data(), want), 3e-2);
  EXPECT_GT(scaled_error(bf16.data(), want), 0.0);  // the products did run in bf16
}

TEST(MoonVit, RejectsAGridThatIsNotAMultipleOfTheMerge) {
  ParamStore store;
  MoonVit tower(store, k25_like().vision(), 20);
  store.allocate();
  randomize(store, 1);
  const std::vector<float> pixels(size_t(3 * 4 * 12), 0.0f);
  const TowerImage image{3, 4, pixels.data()};
  std::vector<float> out(100);
  EXPECT_THROW(tower.forward({&image, 1}, out.data(), Precision::F32, test::test_workspace()), Error);
}

TEST(MoonVit, RejectsAHeadWidthWithoutWholeRotaryQuads) {
  Config c = k25_like();
  c.head_dim = 10;
  ParamStore store;
  EXPECT_THROW(MoonVit(store, c.vision(), c.text_hidden_size), Error);
}

}  // namespace
}  // namespace hyla
