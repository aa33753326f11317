#include "hyla/model/vision_tower.h"

#include <algorithm>
#include <cmath>

#include "hyla/core/error.h"
#include "hyla/kernels/activations.h"
#include "hyla/kernels/attention.h"
#include "hyla/kernels/layout.h"
#include "hyla/kernels/norm.h"
#include "hyla/kernels/residual.h"
#include "hyla/kernels/rope.h"

namespace hyla {
namespace {

// rows of `dim` values each += bias (a plain loop: O(rows·dim) beside the products' O(rows·dim·in)).
void add_bias(const Param* bias, int64_t rows, int64_t dim, float* y) {
  if (!bias) return;
  const float* b = bias->value.data<float>();
  for (int64_t r = 0; r < rows; ++r)
#pragma omp simd
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] += b[j];
}

float* grow(Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() < n) t = Tensor::empty(DType::F32, {std::max<int64_t>(n, 1)});
  return t.data<float>();
}

}  // namespace

void VisionTowerConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* name) {
    HYLA_CHECK(v > 0, "{}: vision tower {} must be positive, got {}", source, name, v);
  };
  positive(patch_size, "patch_size");
  positive(channels, "channels");
  positive(hidden_size, "hidden_size");
  positive(num_heads, "num_heads");
  positive(head_dim, "head_dim");
  positive(num_layers, "num_layers");
  positive(intermediate_size, "intermediate_size");
  positive(pos_emb_height, "pos_emb_height");
  positive(pos_emb_width, "pos_emb_width");
  positive(merge, "merge");
  positive(text_hidden_size, "text_hidden_size");
  HYLA_CHECK(head_dim % 4 == 0, "{}: vision tower head_dim {} is not a multiple of 4 (2-D rotary pairs)", source,
             head_dim);
  HYLA_CHECK(norm_eps > 0 && projector_eps > 0, "{}: vision tower norm epsilons must be positive", source);
  HYLA_CHECK(rope_theta > 1, "{}: vision tower rope_theta must exceed 1, got {}", source, rope_theta);
}

VisionTower::Norm VisionTower::make_norm(ParamStore& store, const std::string& name, int64_t dim,
                                         bool with_bias) const {
  Norm n;
  n.weight = &store.add(name + ".weight", {dim}, Init::Ones, Component::Vision, /*weight_decay=*/false);
  if (with_bias) n.bias = &store.add(name + ".bias", {dim}, Init::Zeros, Component::Vision, false);
  return n;
}

Param* VisionTower::make_bias(ParamStore& store, const std::string& name, int64_t dim, bool present) const {
  return present ? &store.add(name + ".bias", {dim}, Init::Zeros, Component::Vision, false) : nullptr;
}

void VisionTower::Norm::forward(const VisionTowerConfig::Norm kind, const float* x, int64_t rows, int64_t dim,
                                float eps, float* y) const {
  if (kind == VisionTowerConfig::Norm::LayerNorm)
    layernorm_forward(x, dim, weight->v(), bias ? bias->v() : nullptr, rows, dim, eps, y, dim, nullptr);
  else
    rmsnorm_forward(x, dim, weight->v(), rows, dim, eps, y, dim, nullptr);
}

VisionTower::VisionTower(ParamStore& store, const VisionTowerConfig& config) : config_(config) {
  config_.validate("vision tower");
  const VisionTowerConfig& c = config_;
  const int64_t D = c.hidden_size, inner = c.num_heads * c.head_dim, merged = c.merge * c.merge * D;
  const bool layer_norm = c.norm == VisionTowerConfig::Norm::LayerNorm;
  patch_embed_ = Linear(store, "vision_tower.patch_embed.proj", c.patch_values(), D, Component::Vision);
  patch_bias_ = make_bias(store, "vision_tower.patch_embed.proj", D, c.bias);
  pos_emb_ = &store.add("vision_tower.patch_embed.pos_emb.weight", {c.pos_emb_height, c.pos_emb_width, D},
                        Init::Normal, Component::Vision);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(l);
    Block b;
    b.norm0 = make_norm(store, p + ".norm0", D, layer_norm);
    b.norm1 = make_norm(store, p + ".norm1", D, layer_norm);
    b.wqkv = Linear(store, p + ".wqkv", D, 3 * inner, Component::Vision);
    b.wqkv_bias = make_bias(store, p + ".wqkv", 3 * inner, c.bias);
    b.wo = Linear(store, p + ".wo", inner, D, Component::Vision, Init::NormalOutput);
    b.wo_bias = make_bias(store, p + ".wo", D, c.bias);
    b.fc0 = Linear(store, p + ".mlp.fc0", D, c.intermediate_size, Component::Vision);
    b.fc0_bias = make_bias(store, p + ".mlp.fc0", c.intermediate_size, c.bias);
    b.fc1 = Linear(store, p + ".mlp.fc1", c.intermediate_size, D, Component::Vision, Init::NormalOutput);
    b.fc1_bias = make_bias(store, p + ".mlp.fc1", D, c.bias);
    blocks_.push_back(b);
  }
  final_norm_ = make_norm(store, "vision_tower.encoder.final_layernorm", D, layer_norm);
  const bool v1 = c.projector == VisionTowerConfig::Projector::PatchMerger;
  if (v1) pre_norm_ = make_norm(store, "mm_projector.pre_norm", D, true);
  proj0_ = Linear(store, "mm_projector.proj.0", merged, merged, Component::Vision);
  proj0_bias_ = make_bias(store, "mm_projector.proj.0", merged, v1);
  proj2_ = Linear(store, "mm_projector.proj.2", merged, c.text_hidden_size, Component::Vision);
  proj2_bias_ = make_bias(store, "mm_projector.proj.2", c.text_hidden_size, v1);
  if (!v1) post_norm_ = make_norm(store, "mm_projector.post_norm", c.text_hidden_size, false);
}

int64_t VisionTower::tokens(const TowerImage& image) const {
  return (image.grid_rows / config_.merge) * (image.grid_cols / config_.merge);
}

void VisionTower::forward(std::span<const TowerImage> images, float* out, Precision precision, Workspace& workspace) {
  const VisionTowerConfig& c = config_;
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, inner = H * hd, I = c.intermediate_size;
  const int64_t m = c.merge, merged = m * m * D, text = c.text_hidden_size;
  const float eps = float(c.norm_eps);

  // The packed batch: image i owns patch rows [starts[i], starts[i+1]).
  starts_.assign(1, 0);
  patch_rows_.clear(), patch_cols_.clear();
  int64_t out_rows = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const TowerImage& img = images[i];
    HYLA_CHECK(img.grid_rows > 0 && img.grid_cols > 0 && img.grid_rows % m == 0 && img.grid_cols % m == 0,
               "image {}: a grid of {}x{} patches is not a positive multiple of the merge {}", i, img.grid_rows,
               img.grid_cols, m);
    HYLA_CHECK(img.patches != nullptr, "image {}: no patch values", i);
    starts_.push_back(starts_.back() + img.grid_rows * img.grid_cols);
    for (int64_t r = 0; r < img.grid_rows; ++r)
      for (int64_t col = 0; col < img.grid_cols; ++col) patch_rows_.push_back(r), patch_cols_.push_back(col);
    out_rows += tokens(img);
  }
  const int64_t n = starts_.back(), batch = int64_t(images.size());
  if (n == 0) return;

  float* x = grow(x_, n * D);
  float* normed = grow(normed_, n * D);
  float* qkv = grow(qkv_, n * 3 * inner);
  float* q = grow(q_, n * inner);
  float* k = grow(k_, n * inner);
  float* v = grow(v_, n * inner);
  float* attn = grow(attn_, n * inner);
  float* lse = grow(lse_, n * H);
  float* hidden = grow(hidden_, n * std::max(I, D));
  float* rope = grow(rope_, n * hd);

  // Patch embedding, then the learned positions resized to each image's grid.
  for (int64_t i = 0; i < batch; ++i) {
    const TowerImage& img = images[size_t(i)];
    const int64_t rows = img.grid_rows * img.grid_cols;
    float* xi = x + starts_[size_t(i)] * D;
    patch_embed_.forward(img.patches, rows, xi, precision);
    add_bias(patch_bias_, rows, D, xi);
    float* pos = grow(pos_, rows * D);
    resample_grid(c.pos_emb_resample, pos_emb_->v(), c.pos_emb_height, c.pos_emb_width, D, pos, img.grid_rows,
                  img.grid_cols);
    add_rows(xi, pos, rows, D, xi);
  }
  rope_table_2d(patch_rows_.data(), patch_cols_.data(), n, hd, c.rope_theta, rope);

  const AttentionDims dims{H, hd, hd, 0, float(1.0 / std::sqrt(double(hd))),
                           attention_use_bf16_products(precision == Precision::BF16), /*causal=*/false};
  const HeadLayout packed{inner, hd}, in_qkv{3 * inner, hd};
  for (Block& b : blocks_) {
    b.norm0.forward(c.norm, x, n, D, eps, normed);
    b.wqkv.forward(normed, n, qkv, precision);
    add_bias(b.wqkv_bias, n, 3 * inner, qkv);
    rope_forward(rope, n, H, hd, qkv, in_qkv, q, packed);
    rope_forward(rope, n, H, hd, qkv + inner, in_qkv, k, packed);
    copy_heads(qkv + 2 * inner, in_qkv, n, H, hd, v, packed);
    attention_forward(dims, batch, starts_.data(), starts_.data(), q, k, v, attn, lse, workspace);
    b.wo.forward(attn, n, normed, precision);
    add_bias(b.wo_bias, n, D, normed);
    add_rows(x, normed, n, D, x);

    b.norm1.forward(c.norm, x, n, D, eps, normed);
    b.fc0.forward(normed, n, hidden, precision);
    add_bias(b.fc0_bias, n, I, hidden);
    gelu_forward(Gelu::Tanh, hidden, n * I, hidden);
    b.fc1.forward(hidden, n, normed, precision);
    add_bias(b.fc1_bias, n, D, normed);
    add_rows(x, normed, n, D, x);
  }
  final_norm_.forward(c.norm, x, n, D, eps, normed);

  // The merge: output row (i, j) of an image's (rows/m)×(cols/m) grid is its m×m window's patches
  // concatenated row-major, [(mi, mj), (mi, mj+1), …, (mi+m−1, mj+m−1)].
  float* cat = grow(merged_, out_rows * merged);
  int64_t t = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const TowerImage& img = images[size_t(i)];
    const float* base = normed + starts_[size_t(i)] * D;
    for (int64_t gi = 0; gi < img.grid_rows / m; ++gi)
      for (int64_t gj = 0; gj < img.grid_cols / m; ++gj, ++t)
        for (int64_t wi = 0; wi < m; ++wi)
          for (int64_t wj = 0; wj < m; ++wj) {
            const float* src = base + ((gi * m + wi) * img.grid_cols + gj * m + wj) * D;
            std::copy(src, src + D, cat + t * merged + (wi * m + wj) * D);
          }
  }

  // The projector.
  float* mid = grow(projected_, out_rows * merged);
  if (pre_norm_.weight)
    layernorm_forward(cat, D, pre_norm_.weight->v(), pre_norm_.bias->v(), out_rows * m * m, D,
                      float(c.projector_eps), cat, D, nullptr);
  proj0_.forward(cat, out_rows, mid, precision);
  add_bias(proj0_bias_, out_rows, merged, mid);
  gelu_forward(Gelu::Erf, mid, out_rows * merged, mid);
  proj2_.forward(mid, out_rows, out, precision);
  add_bias(proj2_bias_, out_rows, text, out);
  if (post_norm_.weight)
    rmsnorm_forward(out, text, post_norm_.weight->v(), out_rows, text, float(c.projector_eps), out, text, nullptr);
}

}  // namespace hyla
