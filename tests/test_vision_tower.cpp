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
#include "hyla/model/vision_tower.h"
#include "test_util.h"

namespace hyla {
namespace {

using Config = VisionTowerConfig;
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

// ---- the double reference ----

// PyTorch's source taps along one axis (align_corners=False), in double.
std::vector<std::pair<int64_t, double>> taps(GridResample mode, int64_t o, int64_t in, int64_t out) {
  double s = double(in) / double(out) * (double(o) + 0.5) - 0.5;
  auto clamp = [&](int64_t i) { return std::min(std::max<int64_t>(i, 0), in - 1); };
  if (mode == GridResample::Bilinear) {
    s = std::max(s, 0.0);
    const int64_t i0 = int64_t(s);
    return {{clamp(i0), 1 - (s - double(i0))}, {clamp(i0 + 1), s - double(i0)}};
  }
  const double a = -0.75, f = std::floor(s), t = s - f;
  auto kernel = [a](double d) {
    d = std::abs(d);
    return d <= 1 ? (a + 2) * d * d * d - (a + 3) * d * d + 1 : a * d * d * d - 5 * a * d * d + 8 * a * d - 4 * a;
  };
  std::vector<std::pair<int64_t, double>> r;
  for (int k = -1; k <= 2; ++k) r.push_back({clamp(int64_t(f) + k), kernel(t - k)});
  return r;
}

// The parameters in double (finite differences perturb them here), shapes from the store.
struct Weights {
  const ParamStore& store;
  std::map<std::string, std::vector<double>> values;
  explicit Weights(const ParamStore& s) : store(s) {
    for (const auto& p : s.params()) values[p->name].assign(p->v(), p->v() + p->numel());
  }
  const std::vector<double>& operator()(const std::string& name) const { return values.at(name); }
};

// y[n, out] = x[n, in]·Wᵀ (+ b).
std::vector<double> linear(const std::vector<double>& x, int64_t n, const Weights& weights, const std::string& name,
                           bool bias) {
  const std::vector<double>& w = weights(name + ".weight");
  const Param& param = weights.store.get(name + ".weight");
  const int64_t out = param.shape[0], in = param.shape[1];
  const std::vector<double> b = bias ? weights(name + ".bias") : std::vector<double>(size_t(out), 0.0);
  std::vector<double> y(size_t(n * out));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[size_t(o)];
      for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

void norm(std::vector<double>& x, int64_t dim, const Weights& weights, const std::string& name, bool layer_norm,
          double eps) {
  const std::vector<double>& w = weights(name + ".weight");
  const std::vector<double> b = layer_norm ? weights(name + ".bias") : std::vector<double>(size_t(dim), 0.0);
  for (size_t r = 0; r < x.size() / size_t(dim); ++r) {
    double* row = &x[r * size_t(dim)];
    double mean = 0, var = 0;
    if (layer_norm) {
      for (int64_t j = 0; j < dim; ++j) mean += row[j];
      mean /= double(dim);
    }
    for (int64_t j = 0; j < dim; ++j) var += (row[j] - mean) * (row[j] - mean);
    const double inv = 1 / std::sqrt(var / double(dim) + eps);
    for (int64_t j = 0; j < dim; ++j) row[j] = (row[j] - mean) * inv * w[size_t(j)] + b[size_t(j)];
  }
}

double gelu_tanh(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }
double gelu_erf(double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }

// One image through the tower and projector, as SPEC §7.2 writes it.
std::vector<double> reference(const Config& c, const Weights& store, const TowerImage& img) {
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, inner = H * hd, R = img.grid_rows,
                C = img.grid_cols, n = R * C, m = c.merge;
  const bool ln = c.norm == Config::Norm::LayerNorm;
  std::vector<double> patches(img.patches, img.patches + n * c.patch_values());
  std::vector<double> x = linear(patches, n, store, "vision_tower.patch_embed.proj", c.bias);
  const std::vector<double>& pos = store("vision_tower.patch_embed.pos_emb.weight");
  for (int64_t r = 0; r < R; ++r)
    for (int64_t col = 0; col < C; ++col)
      for (const auto& [i, wi] : taps(c.pos_emb_resample, r, c.pos_emb_height, R))
        for (const auto& [j, wj] : taps(c.pos_emb_resample, col, c.pos_emb_width, C))
          for (int64_t d = 0; d < D; ++d)
            x[size_t((r * C + col) * D + d)] += wi * wj * pos[size_t((i * c.pos_emb_width + j) * D + d)];
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(l);
    std::vector<double> h = x;
    norm(h, D, store, p + ".norm0", ln, c.norm_eps);
    std::vector<double> qkv = linear(h, n, store, p + ".wqkv", c.bias);
    // 2-D rotary positions on q and k: dims (4i, 4i+1) by column·f_i, (4i+2, 4i+3) by row·f_i.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t part = 0; part < 2; ++part)
        for (int64_t head = 0; head < H; ++head) {
          double* v = &qkv[size_t(t * 3 * inner + part * inner + head * hd)];
          for (int64_t i = 0; i < hd / 4; ++i) {
            const double f = std::pow(c.rope_theta, -4.0 * double(i) / double(hd));
            for (int64_t axis = 0; axis < 2; ++axis) {
              const double angle = double(axis == 0 ? t % C : t / C) * f;
              double& a = v[4 * i + 2 * axis];
              double& b = v[4 * i + 2 * axis + 1];
              const double a0 = a, b0 = b;
              a = a0 * std::cos(angle) - b0 * std::sin(angle);
              b = a0 * std::sin(angle) + b0 * std::cos(angle);
            }
          }
        }
    std::vector<double> o(size_t(n * inner), 0.0), scores(static_cast<size_t>(n));
    for (int64_t head = 0; head < H; ++head)
      for (int64_t t = 0; t < n; ++t) {
        double mx = -INFINITY, sum = 0;
        for (int64_t s = 0; s < n; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += qkv[size_t(t * 3 * inner + head * hd + e)] * qkv[size_t(s * 3 * inner + inner + head * hd + e)];
          scores[size_t(s)] = dot / std::sqrt(double(hd));
          mx = std::max(mx, scores[size_t(s)]);
        }
        for (int64_t s = 0; s < n; ++s) sum += scores[size_t(s)] = std::exp(scores[size_t(s)] - mx);
        for (int64_t s = 0; s < n; ++s)
          for (int64_t e = 0; e < hd; ++e)
            o[size_t(t * inner + head * hd + e)] +=
                scores[size_t(s)] / sum * qkv[size_t(s * 3 * inner + 2 * inner + head * hd + e)];
      }
    const std::vector<double> attn = linear(o, n, store, p + ".wo", c.bias);
    for (size_t i = 0; i < x.size(); ++i) x[i] += attn[i];
    h = x;
    norm(h, D, store, p + ".norm1", ln, c.norm_eps);
    std::vector<double> u = linear(h, n, store, p + ".mlp.fc0", c.bias);
    for (double& e : u) e = gelu_tanh(e);
    const std::vector<double> mlp = linear(u, n, store, p + ".mlp.fc1", c.bias);
    for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
  }
  norm(x, D, store, "vision_tower.encoder.final_layernorm", ln, c.norm_eps);
  const bool v1 = c.projector == Config::Projector::PatchMerger;
  if (v1) norm(x, D, store, "mm_projector.pre_norm", true, c.projector_eps);  // per patch, before the merge
  const int64_t tokens = (R / m) * (C / m);
  std::vector<double> cat;
  for (int64_t gi = 0; gi < R / m; ++gi)
    for (int64_t gj = 0; gj < C / m; ++gj)
      for (int64_t wi = 0; wi < m; ++wi)
        for (int64_t wj = 0; wj < m; ++wj) {
          const double* row = &x[size_t(((gi * m + wi) * C + gj * m + wj) * D)];
          cat.insert(cat.end(), row, row + D);
        }
  std::vector<double> mid = linear(cat, tokens, store, "mm_projector.proj.0", v1);
  for (double& e : mid) e = gelu_erf(e);
  std::vector<double> out = linear(mid, tokens, store, "mm_projector.proj.2", v1);
  if (!v1) norm(out, c.text_hidden_size, store, "mm_projector.post_norm", false, c.projector_eps);
  return out;
}

// ---- the tower against it ----

Config k25_like() {
  Config c;
  c.patch_size = 2, c.channels = 3, c.hidden_size = 24, c.num_heads = 2, c.head_dim = 12, c.num_layers = 2;
  c.intermediate_size = 40, c.pos_emb_height = 4, c.pos_emb_width = 6, c.text_hidden_size = 20;
  return c;
}

Config k3_like() {
  Config c = k25_like();
  c.num_heads = 3, c.head_dim = 16;  // the attention's width (48) differs from the tower's (24), as in K3
  c.norm = Config::Norm::RmsNorm, c.norm_eps = 1.0 / 128, c.bias = false;
  c.pos_emb_resample = GridResample::Bilinear, c.projector = Config::Projector::PatchMergerV2;
  return c;
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

TEST(VisionTower, MatchesTheDoubleReferenceInBothVariants) {
  for (const Config& c : {k25_like(), k3_like()}) {
    SCOPED_TRACE(c.bias ? "K2.5-like" : "K3-like");
    ParamStore store;
    VisionTower tower(store, c);
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
      const std::vector<double> want = reference(c, Weights(store), images[i]);
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

TEST(VisionTower, GradientsMatchFiniteDifferences) {
  for (const Config& c : {k25_like(), k3_like()}) {
    SCOPED_TRACE(c.bias ? "K2.5-like" : "K3-like");
    ParamStore store;
    VisionTower tower(store, c);
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

    Weights weights(store);
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
      EXPECT_GT(test::expect_gradients(p->name, loss, weights.values.at(p->name),
                                       [&](int64_t e) { return double(g[e]); }, entries),
                0.0)
          << p->name << ": the entries tested nothing";
    }
  }
}

TEST(VisionTower, RejectsAGridThatIsNotAMultipleOfTheMerge) {
  ParamStore store;
  VisionTower tower(store, k25_like());
  store.allocate();
  randomize(store, 1);
  const std::vector<float> pixels(size_t(3 * 4 * 12), 0.0f);
  const TowerImage image{3, 4, pixels.data()};
  std::vector<float> out(100);
  EXPECT_THROW(tower.forward({&image, 1}, out.data(), Precision::F32, test::test_workspace()), Error);
}

TEST(VisionTower, RejectsAHeadWidthWithoutWholeRotaryQuads) {
  Config c = k25_like();
  c.head_dim = 10;
  ParamStore store;
  EXPECT_THROW(VisionTower(store, c), Error);
}

}  // namespace
}  // namespace hyla
